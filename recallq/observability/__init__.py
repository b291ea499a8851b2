"""What recallq reports to Prometheus: the counters and the hooks that move them (metrics),
and the state gauges read at scrape time (gauges), which are handed what they read.
"""
