-- toolgate 0028 for SQLite: what a consent flow needs beyond its code (see
-- the PostgreSQL migration).

ALTER TABLE consent_flows ADD COLUMN client_document TEXT NULL;
ALTER TABLE consent_flows ADD COLUMN revocation_endpoint TEXT NULL;
