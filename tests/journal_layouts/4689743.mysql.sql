-- xasink decision log for MySQL 8 / MariaDB 10.5+ (the same tables xasink creates on first use).
-- Generated from xasink.journal.journal_metadata(); tests/test_mysql_dialect.py keeps it in sync.
-- Run it in the target database when the writing user may not CREATE tables, e.g.
--   mysql -h HOST -u admin -p shop < sql/mysql.sql
-- With journalTablePrefix / journalSchema set, rename the tables accordingly.
-- The writing user needs SELECT, INSERT, UPDATE, DELETE on both tables, and XA_RECOVER_ADMIN on MySQL 8:
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_sinks TO 'etl'@'%';
--   GRANT SELECT, INSERT, UPDATE, DELETE ON shop.xasink_batches TO 'etl'@'%';
--   GRANT XA_RECOVER_ADMIN ON *.* TO 'etl'@'%';          -- MySQL 8 only

-- One row per sink; its row lock serializes deciding a batch against rolling back undecided branches.
CREATE TABLE IF NOT EXISTS xasink_sinks (
    sink_id VARCHAR(32) NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (sink_id)
) ENGINE=InnoDB;

-- One row per decided (sink, batch): state 'committing' (decided) or 'committed', the exact xid list.
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
    PRIMARY KEY (sink_id, batch_id)
) ENGINE=InnoDB;
