//! The single retry layer toward backends (in progress).
