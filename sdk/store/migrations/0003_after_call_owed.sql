-- depends: 0002_dnc_source_meta
-- duetaspan store, version 3: the after-call work a call is still owed by a served agent (`end`: its
-- `call.ended`, from `call.started` on; `analysis`: its end-of-call analysis and `call.analyzed`; NULL:
-- nothing), so that a server killed between writing a call's record and committing its event finishes it
-- at its next start (duetaspan.webhooks.lifecycle.AfterCall).

ALTER TABLE calls ADD COLUMN owed TEXT;
CREATE INDEX calls_owed ON calls (owed);
