"""The ground floor: values and pure rules every layer uses (no I/O).

Statuses and the moves between them, what a stage did with an item, usage, the judge-call
errors, scoring, context resolution, comparisons, agreement, groups, exports, CI gates and
exit codes, untrusted-input checks and redaction.
"""
