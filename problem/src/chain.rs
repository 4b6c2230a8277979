//! Walking an error's cause chain for a known type, instead of matching on messages.

use std::error::Error;

/// The first error of type `T` in `error`'s cause chain, `error` itself included.
pub fn caused_by<'a, T: Error + 'static>(error: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// Whether an error of type `T` is anywhere in `error`'s cause chain.
pub fn is_caused_by<T: Error + 'static>(error: &(dyn Error + 'static)) -> bool {
    caused_by::<T>(error).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("root")]
    struct Root(u8);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper")]
    struct Wrapper(#[source] Root);

    #[derive(Debug, thiserror::Error)]
    #[error("other")]
    struct Other;

    #[test]
    fn finds_the_cause_at_any_depth() {
        let error = Wrapper(Root(7));
        assert_eq!(caused_by::<Root>(&error).map(|r| r.0), Some(7));
        assert!(is_caused_by::<Wrapper>(&error));
        assert!(!is_caused_by::<Other>(&error));
        let io = std::io::Error::other(Wrapper(Root(1)));
        assert!(is_caused_by::<Root>(&io));
    }
}
