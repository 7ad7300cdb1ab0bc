-- xasink decision log for PostgreSQL (the same tables xasink creates on first use).
-- Generated from xasink.journal.journal_metadata(); tests/test_mysql_dialect.py keeps it in sync.
-- Run it in the target database when the writing user may not CREATE tables, e.g.
--   psql -h HOST -U admin -d shop -f sql/postgres.sql
-- With journalTablePrefix / journalSchema set, rename (or schema-qualify) the tables accordingly.
-- The writing user needs SELECT, INSERT, UPDATE, DELETE on the three tables:
--   GRANT SELECT, INSERT, UPDATE, DELETE ON xasink_sinks, xasink_batches, xasink_claims TO etl;
-- and the server needs max_prepared_transactions >= the partitions of one batch (restart to change it).

-- One row per sink; its row lock serializes deciding a batch against rolling back undecided branches.
CREATE TABLE IF NOT EXISTS xasink_sinks (
    sink_id VARCHAR(32) NOT NULL,
    created_at TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    PRIMARY KEY (sink_id)
);

-- One row per decided (sink, batch): state 'committing' (decided) or 'committed', the exact xid list.
CREATE TABLE IF NOT EXISTS xasink_batches (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    xids TEXT NOT NULL,
    rows BIGINT NOT NULL,
    branches INTEGER NOT NULL,
    prepare_ms INTEGER NOT NULL,
    commit_ms INTEGER,
    decided_at TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    committed_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (sink_id, batch_id)
);

-- Which writer runs claimed an undecided (sink, batch), and which one holds it now (superseded = false).
CREATE TABLE IF NOT EXISTS xasink_claims (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    run VARCHAR(8) NOT NULL,
    superseded BOOLEAN NOT NULL,
    claimed_at TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    PRIMARY KEY (sink_id, batch_id, run)
);
