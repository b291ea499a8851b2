"""The provider batch lane (batch-mode runs): request lines and the online rules per answer
(requests), batches and their lines in Postgres (store), the poll that drives them (lane),
what the lane needs of a provider's Batch API (provider) and its litellm adapter
(litellm_files).
"""
