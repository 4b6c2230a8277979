//! Fields of human log lines without colour, as `tracing-subscriber`'s default formatter
//! writes them (`name=value` separated by spaces, the message first and unnamed, strings
//! quoted, control characters of the message escaped), with fewer formatting calls.
//!
//! The default formatter styles every field name and `=` even when colour is off (two
//! styled strings per field) and escapes the message one character at a time; with the
//! access log's 18 fields that was about a quarter of a proxied request's instructions
//! (BENCHMARKS.md). Here a field is one `write!`, and the message is
//! written whole unless it holds a character to escape. Errors and anything unusual go to
//! the default visitor, so the text stays the same.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::FormatFields;

/// The field formatter for human logs written without colour (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = PlainVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

// === impl PlainVisitor ===

impl PlainVisitor<'_> {
    fn pad(&mut self) {
        if self.is_empty {
            self.is_empty = false;
        } else {
            self.result = self.writer.write_char(' ');
        }
    }

    fn message(&mut self, value: fmt::Arguments<'_>) {
        self.pad();
        if self.result.is_ok() {
            self.result = Escaping(&mut self.writer).write_fmt(value);
        }
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        if field.name() == "message" {
            self.message(format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_err() {
            return;
        }
        // Rare: the default visitor writes the error and its sources.
        let mut default = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        default.record_error(field, value);
        self.result = default.finish();
        self.is_empty = false;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // As the default formatter: `log.*` fields were shown as metadata already.
        if name.starts_with("log.") {
            return;
        }
        if name == "message" {
            self.message(format_args!("{value:?}"));
            return;
        }
        self.pad();
        if self.result.is_ok() {
            let name = name.strip_prefix("r#").unwrap_or(name);
            self.result = write!(self.writer, "{name}={value:?}");
        }
    }
}

/// Writes through, escaping what the default formatter escapes in a message: ESC, BEL, BS,
/// FF, DEL and the C1 controls. A chunk without any is written whole.
struct Escaping<'a, 'b>(&'a mut Writer<'b>);

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls (U+0080..U+009F) are encoded as 0xC2 0x80..=0x9F.
        if !s
            .bytes()
            .any(|b| matches!(b, 0x07 | 0x08 | 0x0c | 0x1b | 0x7f | 0xc2))
        {
            return self.0.write_str(s);
        }
        for ch in s.chars() {
            match ch {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                ch if ('\u{80}'..='\u{9f}').contains(&ch) => {
                    write!(self.0, "\\u{{{:x}}}", ch as u32)?;
                }
                ch => self.0.write_char(ch)?,
            }
        }
        Ok(())
    }
}

/// Collects what a subscriber writes (tests).
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// Everything written so far, as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    fn events() {
        let path = "/orders/7";
        let error = Outer(std::io::Error::other("inner"));
        let err_ref: &(dyn std::error::Error + 'static) = &error;
        tracing::info!(
            target: "portcullis::access",
            request_id = %"req-1",
            attempts = 2u32,
            status = 201u16,
            duration_ms = 1.5f64,
            whole = 2.0f64,
            rate_limit = "allowed",
            path = %path,
            ok = true,
            neg = -3i64,
            "request"
        );
        tracing::warn!(r#type = "x", upstream = "orders", "endpoints changed");
        tracing::warn!(error = err_ref, "with an error");
        tracing::warn!("control \x1b[31mred\x07 and \u{85} kept \u{e9}");
        tracing::info!(message = "as a field", after = 1);
        let span = tracing::info_span!("attempt", upstream = "orders", n = 1);
        let _entered = span.enter();
        tracing::info!(x = ?Some("y"), "in a span");
    }

    fn render(plain: bool) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone());
        if plain {
            tracing::subscriber::with_default(builder.fmt_fields(PlainFields).finish(), events);
        } else {
            tracing::subscriber::with_default(builder.finish(), events);
        }
        out.text()
    }

    #[test]
    fn lines_read_as_the_default_formatter_writes_them() {
        let (plain, default) = (render(true), render(false));
        assert_eq!(plain, default);
        assert!(
            plain.contains("request request_id=req-1 attempts=2"),
            "{plain}"
        );
        assert!(plain.contains("\\x1b[31mred\\x07"), "{plain}");
    }
}
