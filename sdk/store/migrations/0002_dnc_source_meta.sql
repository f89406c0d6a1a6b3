-- depends: 0001_initial
-- duetaspan store, version 2: where a do-not-call entry came from (cli, api, opt_out tool, import) and
-- lookups of the call index by number.

ALTER TABLE dnc ADD COLUMN source TEXT NOT NULL DEFAULT 'api';
CREATE INDEX calls_from ON calls (from_number);
CREATE INDEX calls_to ON calls (to_number);

-- what the store did once (e.g. index an old record folder)
CREATE TABLE store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
