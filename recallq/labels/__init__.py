"""Human labels of a run's claims: storage, file imports, random samples, and the agreement
views; the label service that the HTTP API and the CLI both use.
"""
