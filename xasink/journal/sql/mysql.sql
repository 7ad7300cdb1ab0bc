-- xasink decision log for MySQL 8 / MariaDB 10.5+ (the same tables xasink creates on first use).
-- Generated from xasink.journal.journal_metadata(); tests/test_mysql_dialect.py keeps it in sync.
-- Run it in the target database when the writing user may not CREATE tables, e.g.
--   xasink ddl mysql | mysql -h HOST -u admin -p shop        (this file: xasink/journal/sql/mysql.sql)
-- With journalTablePrefix / journalSchema set, rename the tables accordingly.
-- The decision log is five tables. The writing user needs SELECT, INSERT on the first, SELECT, INSERT,
-- UPDATE, DELETE on the other four (xasink_parts: multi-target transactions record their writes there; a
-- single-table writer's trim and recovery read and clean it), and XA_RECOVER_ADMIN on MySQL 8:
--   GRANT SELECT, INSERT ON shop.xasink_log TO 'etl'@'%';
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_sinks TO 'etl'@'%';
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_batches TO 'etl'@'%';
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_claims TO 'etl'@'%';
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_parts TO 'etl'@'%';
--   GRANT XA_RECOVER_ADMIN ON *.* TO 'etl'@'%';          -- MySQL 8 only

-- A log made by an older xasink is upgraded by the first writer of this version (it needs ALTER on the
-- log's tables). Where writers may not ALTER, upgrade it by hand, with no older writer running: run this
-- file (its CREATE TABLE IF NOT EXISTS make the tables an older log lacks), then the statements between
-- BEGIN UPGRADE and END UPGRADE, in order. Each skips what the log has already, so a log of any earlier
-- version, or one upgraded halfway, ends up with this layout; running them again changes nothing.
-- BEGIN UPGRADE
--   ALTER TABLE xasink_sinks ADD COLUMN IF NOT EXISTS horizon BIGINT;
--   -- a log without batches.target was made by a version whose trim deleted committed batches: record,
--   -- per sink, the ids it may have forgotten (refused from now on, see ForgottenBatchError)
--   UPDATE xasink_sinks SET horizon = (SELECT MAX(batch_id) - 1 FROM xasink_batches b
--       WHERE b.sink_id = xasink_sinks.sink_id) WHERE horizon IS NULL AND NOT EXISTS (SELECT 1
--       FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'xasink_batches'
--       AND COLUMN_NAME = 'target');
--   ALTER TABLE xasink_batches ADD COLUMN IF NOT EXISTS compacted BOOL NOT NULL DEFAULT false;
--   ALTER TABLE xasink_claims ADD COLUMN IF NOT EXISTS guard VARCHAR(64);
--   ALTER TABLE xasink_batches ADD COLUMN IF NOT EXISTS target TEXT;
--   -- identities compare byte for byte (the server's default collation ignores case: sinks "Orders" and
--   -- "orders" would be one); no two ids that differ only in case can be in the old tables' keys
--   ALTER TABLE xasink_log CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
--   ALTER TABLE xasink_sinks CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
--   ALTER TABLE xasink_batches CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
--   ALTER TABLE xasink_claims CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
--   ALTER TABLE xasink_parts CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
-- END UPGRADE
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS: there leave IF NOT EXISTS out, and skip a column the log has.

-- The log's identity: one row (slot 1), a random log_id drawn by the first writer. Every branch's xid
-- carries it; this log finishes only branches that carry it. Never change it while branches are prepared.
CREATE TABLE IF NOT EXISTS xasink_log (
    slot SMALLINT NOT NULL,
    log_id VARCHAR(10) NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (slot)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

-- One row per sink; its row lock serializes deciding a batch against rolling back undecided branches.
-- horizon: set when a log made by an older xasink (whose retention deleted batches) is upgraded; batch ids
-- up to it that the log does not hold are refused (ForgottenBatchError). NULL for a log made by this version.
CREATE TABLE IF NOT EXISTS xasink_sinks (
    sink_id VARCHAR(32) NOT NULL,
    created_at DATETIME NOT NULL,
    horizon BIGINT,
    PRIMARY KEY (sink_id)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

-- One row per decided (sink, batch), kept forever: state 'committing' (decided) or 'committed', the exact
-- xid list (emptied, compacted = true, once the batch is older than journalRetention committed batches),
-- and target: what the batch wrote (JSON: db, schema, table, streaming query id).
CREATE TABLE IF NOT EXISTS xasink_batches (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    xids LONGTEXT NOT NULL,
    `rows` BIGINT NOT NULL,
    branches INTEGER NOT NULL,
    prepare_ms INTEGER NOT NULL,
    commit_ms INTEGER,
    decided_at DATETIME NOT NULL,
    committed_at DATETIME,
    compacted BOOL NOT NULL DEFAULT false,
    target TEXT,
    PRIMARY KEY (sink_id, batch_id)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

-- Which writer runs claimed an undecided (sink, batch), and which one holds it now (superseded = false).
CREATE TABLE IF NOT EXISTS xasink_claims (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    run VARCHAR(8) NOT NULL,
    superseded BOOL NOT NULL,
    claimed_at DATETIME NOT NULL,
    guard VARCHAR(64),
    PRIMARY KEY (sink_id, batch_id, run)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

-- One row per write of a multi-target transaction (xasink.transaction): its database (the server's own
-- identity), table and prepared xids, recorded without deciding; the transaction decides over all of them.
-- Created by the first transaction using this log; single-table writers never touch it.
CREATE TABLE IF NOT EXISTS xasink_parts (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    run VARCHAR(8) NOT NULL,
    part INTEGER NOT NULL,
    server VARCHAR(300) NOT NULL,
    target TEXT NOT NULL,
    xids LONGTEXT NOT NULL,
    `rows` BIGINT NOT NULL,
    prepare_ms INTEGER NOT NULL,
    committed BOOL NOT NULL,
    PRIMARY KEY (sink_id, batch_id, run, part)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;
