-- The decision log's tables as each earlier released version of xasink created them on MySQL 8 / MariaDB
-- (see README.md): the oldest layout whole, then, per later version, only the statements that reach its
-- layout from the one before. Layout K is every block up to and including "-- LAYOUT K". No version before
-- this one named a character set or collation: every table has the server's default.

-- LAYOUT 4689743: sinks, batches
CREATE TABLE IF NOT EXISTS xasink_sinks (
    sink_id VARCHAR(32) NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (sink_id)
) ENGINE=InnoDB;
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

-- LAYOUT 0eaf902: + claims (no guard)
CREATE TABLE IF NOT EXISTS xasink_claims (
    sink_id VARCHAR(32) NOT NULL,
    batch_id BIGINT NOT NULL,
    run VARCHAR(8) NOT NULL,
    superseded BOOL NOT NULL,
    claimed_at DATETIME NOT NULL,
    PRIMARY KEY (sink_id, batch_id, run)
) ENGINE=InnoDB;

-- LAYOUT 64bf378: + log, claims.guard
CREATE TABLE IF NOT EXISTS xasink_log (
    slot SMALLINT NOT NULL,
    log_id VARCHAR(10) NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (slot)
) ENGINE=InnoDB;
ALTER TABLE xasink_claims ADD COLUMN guard VARCHAR(64);

-- LAYOUT 338ceb4: + sinks.horizon, batches.compacted, batches.target
ALTER TABLE xasink_sinks ADD COLUMN horizon BIGINT;
ALTER TABLE xasink_batches ADD COLUMN compacted BOOL NOT NULL DEFAULT false;
ALTER TABLE xasink_batches ADD COLUMN target TEXT;

-- LAYOUT 4f4d6a9: + parts
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
) ENGINE=InnoDB;
