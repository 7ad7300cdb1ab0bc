-- Run once by the mysql:8.4 image on first start (docker-compose.yml).
-- Creates the application account used in the examples: etl / etl.
CREATE USER IF NOT EXISTS 'etl'@'%' IDENTIFIED BY 'etl';
GRANT ALL PRIVILEGES ON xasink.* TO 'etl'@'%';
-- MySQL 8 requires XA_RECOVER_ADMIN for XA RECOVER (xasink recovery and sweep).
GRANT XA_RECOVER_ADMIN ON *.* TO 'etl'@'%';
FLUSH PRIVILEGES;
