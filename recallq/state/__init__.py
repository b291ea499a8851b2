"""Where recallq keeps state: the tables (tables), the database (db) and its migrations
(migrate), the claim cache, API keys (apikeys), kept views (kept), and the only writers of item
and run state, the stores: one named method per move (recallq.core.status lists the moves).

Items (ItemStore)                                  guard in the WHERE clause
    take            queued|running → running       status and owner as read; a live holder
                                                   keeps it (checked before the write)
    save_claims     running → running              owner token, status running
    hand_over       running → running (new owner)  owner token, status running
    succeed         running → succeeded            owner token, status running
    fail            running → failed               owner token, status running
    defer           running → queued (due later)   owner token, status running
    requeue_lost    queued|running → queued        status queued|running; rows others lock
                                                   right now are left for the next sweep
    expire_lease    running → running (due now)    status running, owned by the worker
    release_next    pending → queued               run running; rows nobody else locks;
                                                   as many as the dispatch window has room for
Runs (RunStore)
    create          → queued (with its items, pending)
    release_window  queued|running → running, and pending → queued items up to the window
    complete_if_done running → completed           no item of the run unended
    cancel          queued|running → cancelled, and unended items → cancelled (reason "user")
    cancel_for_budget  the same, reason "budget": the run's recorded usage reached its budget
    retry_failed    completed|running → running, and failed items → pending
    resume_cancelled  cancelled → running, and cancelled items → pending (a budget-cancelled
                    run only with a budget above what it spent)
    resume          queued|running items → pending (local mode, after the process stopped)
    forget_idempotency_key   the run no longer answers to its key (a fresh run takes it)
    delete          an ended run, with its items and their claims, is removed
    delete_expired  the same for ended runs older than the retention
Items of batch-mode runs (BatchedItemStore, written by the provider batch lane)
    adopt           pending → batched              run running in batch mode; rows nobody
                                                   else locks
    save_claims, charge, wait   batched → batched  status batched
    succeed / fail  batched → succeeded | failed   status batched

A stage writes only while its pass still owns the item: its owner token and status are checked
in the UPDATE itself, so a stale or duplicate copy of a stage writes nothing (no second set of
claims, no usage counted twice). When a pass lost the item (its run was cancelled, another
pass took it over), the calls it made were still sent and billed: their usage counts on the
item, and nothing else of the pass is written. Usage a write could not store because the
database was down is kept and written once it is back, once per charge (item_charges,
usage_spool): each write records the charges it counted, so a kept copy of one whose commit
landed but whose answer was lost counts nothing more.

The hot path uses Core statements built once, with bound parameters (building SQLAlchemy
expressions per call cost more CPU than running them); a statement that stands alone runs
without BEGIN and COMMIT (Database.single_statement). On Postgres each stage's end is one such
statement (recallq.state.item_writes: the guarded UPDATE of the item as a CTE, the stage's
other writes made only for the row it returned): take and save_claims for all the items of a
group or an extraction call at once, succeed and fail with the verdicts and release_next.
SQLite (local mode) makes the same writes in one transaction each.
"""
