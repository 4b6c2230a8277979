//! Portcullis gateway library.
pub mod config;
pub mod retry;
