"""What runs items: the engine (an item's stages), the runtime a process builds once, the work
queues (Celery's, and local mode's thread pool), the reaper, retention and the broker epoch.
"""
