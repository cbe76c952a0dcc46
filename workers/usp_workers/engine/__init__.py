"""The delivery path: the outbox and the hand-off, claiming and recording, signing, the guarded
HTTP client, verdicts, retries, health and rate limits. Imports only ``storage`` and settings."""
