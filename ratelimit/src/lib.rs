//! Token-bucket (GCRA) rate limiting for Portcullis, as a tower `Layer` (in progress).
