//! Idempotency-Key deduplication for Portcullis, as a tower `Layer` (in progress).
