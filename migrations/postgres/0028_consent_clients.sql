-- toolgate 0028: a consent flow keeps which client asked (toolgate's
-- Client ID Metadata Document's URL, or NULL for the server's registered
-- client) and where the authorization server revokes tokens (RFC 7009),
-- so that the grant it makes is refreshed and revoked as the same client.

ALTER TABLE consent_flows ADD COLUMN client_document TEXT NULL;
ALTER TABLE consent_flows ADD COLUMN revocation_endpoint TEXT NULL;
