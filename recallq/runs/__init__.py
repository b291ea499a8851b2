"""The run service and its use cases: submissions (ingest, quotas, estimates, data files),
cancel, retry, resume and delete, local mode's runs of a file, and every read of a run
(views, items, comparisons).
"""
