//! A route's path: the rule it matches requests by (prefix, exact or pattern) and the
//! rewrite of the path it forwards.

use crate::config::error::Issues;
use crate::config::raw::RawRoute;
use crate::config::routes::pattern::{PathRule, Pattern};

/// Exactly one of `prefix`, `exact`, `pattern`, in the normal form requests are matched in.
pub(super) fn route_path(path: &str, r: &RawRoute, issues: &mut Issues) -> PathRule {
    let given: Vec<(&str, &String)> = [
        ("prefix", r.prefix.as_ref()),
        ("exact", r.exact.as_ref()),
        ("pattern", r.pattern.as_ref()),
    ]
    .into_iter()
    .filter_map(|(field, text)| Some((field, text?)))
    .collect();
    let Some(&(field, text)) = given.first() else {
        issues.push(
            format!("{path}.prefix"),
            "is missing: set exactly one of prefix, exact or pattern",
        );
        return PathRule::Prefix("/".into());
    };
    for (other, _) in &given[1..] {
        issues.push(
            format!("{path}.{other}"),
            format!("is set together with {field}: set exactly one of prefix, exact or pattern"),
        );
    }
    let field_path = format!("{path}.{field}");
    match field {
        "exact" => {
            if let Err(why) = Pattern::check_exact(text) {
                issues.push(field_path, format!("= {text:?}: {why}"));
            }
            PathRule::Exact(text.clone())
        }
        "pattern" => match Pattern::parse(text) {
            Ok(pattern) => PathRule::Pattern(pattern),
            Err(why) => {
                issues.push(field_path, format!("= {text:?}: {why}"));
                PathRule::Exact(text.clone())
            }
        },
        _ => {
            if !text.starts_with('/') {
                issues.push(field_path, format!("= {text:?}: must start with '/'"));
            } else {
                // Requests are matched in normal form; a prefix in another form never matches.
                match crate::edge::target::normalize_path(text) {
                    Ok(std::borrow::Cow::Borrowed(_)) => {}
                    Ok(normal) => issues.push(
                        field_path,
                        format!(
                            "= {text:?}: not in normal form (requests are matched after normalisation); write {normal:?}"
                        ),
                    ),
                    Err(why) => issues.push(field_path, format!("= {text:?}: {why}")),
                }
            }
            PathRule::Prefix(text.clone())
        }
    }
}

/// `rewrite` or `strip_prefix` (the same as `rewrite = "/"`), on a prefix or exact route.
pub(super) fn rewrite(
    path: &str,
    r: &RawRoute,
    rule: &PathRule,
    issues: &mut Issues,
) -> Option<String> {
    let rewrite = match (&r.rewrite, r.strip_prefix) {
        (Some(_), true) => {
            issues.push(
                format!("{path}.rewrite"),
                "is set together with strip_prefix = true: strip_prefix is rewrite = \"/\"; set one",
            );
            return None;
        }
        (Some(text), false) => {
            let ok = text.starts_with('/')
                && !text.contains(['?', '#'])
                && matches!(
                    crate::edge::target::normalize_path(text),
                    Ok(std::borrow::Cow::Borrowed(_))
                );
            if !ok {
                issues.push(
                    format!("{path}.rewrite"),
                    format!(
                        "= {text:?}: a path starting with '/', in normal form, without '?' or '#'"
                    ),
                );
            }
            text.clone()
        }
        (None, true) => "/".to_owned(),
        (None, false) => return None,
    };
    if let PathRule::Pattern(_) = rule {
        let field = if r.rewrite.is_some() {
            "rewrite"
        } else {
            "strip_prefix"
        };
        issues.push(
            format!("{path}.{field}"),
            "applies to prefix and exact routes only (a pattern has no fixed prefix to replace)",
        );
    }
    Some(rewrite)
}
