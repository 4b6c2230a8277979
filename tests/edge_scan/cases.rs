//! The heads of the scan, named by family: `framing-` (where a body ends), `line-` (the
//! request line), `header-` (field syntax and size), `host-` (RFC 9112 §3.2), `path-` and
//! `target-` (what routing would see).

/// A POST whose body is readable under either framing, so a parser that picks one over the
/// other desynchronises on the bytes that follow.
fn post(framing: &str) -> Vec<u8> {
    format!("POST /scan HTTP/1.1\r\nHost: localhost\r\n{framing}\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        .into_bytes()
}

/// A GET with this request line and a good Host.
fn line(request_line: &str) -> Vec<u8> {
    format!("{request_line}\r\nHost: localhost\r\n\r\n").into_bytes()
}

/// A GET of `/scan` with these header lines (and no Host unless they carry one).
fn headers(lines: &str) -> Vec<u8> {
    format!("GET /scan HTTP/1.1\r\n{lines}\r\n\r\n").into_bytes()
}

/// A GET of `target` with a good Host.
fn target(target: &str) -> Vec<u8> {
    line(&format!("GET {target} HTTP/1.1"))
}

/// Every case: a name and the bytes of one request head (with its body, if any).
pub fn heads() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| cases.push((name.to_owned(), bytes));

    // Where does the body end?
    for (name, framing) in [
        (
            "cl-then-te",
            "Content-Length: 4\r\nTransfer-Encoding: chunked",
        ),
        (
            "te-then-cl",
            "Transfer-Encoding: chunked\r\nContent-Length: 4",
        ),
        (
            "te-and-cl-zero",
            "Transfer-Encoding: chunked\r\nContent-Length: 0",
        ),
        ("cl-differs", "Content-Length: 5\r\nContent-Length: 6"),
        ("cl-differs-case", "Content-Length: 5\r\ncontent-length: 6"),
        ("cl-list-differs", "Content-Length: 5, 6"),
        ("cl-list-agrees", "Content-Length: 5, 5"),
        ("cl-list-no-space", "Content-Length: 5,5"),
        ("cl-plus", "Content-Length: +5"),
        ("cl-minus", "Content-Length: -5"),
        ("cl-hex", "Content-Length: 0x5"),
        ("cl-underscore", "Content-Length: 1_0"),
        ("cl-inner-space", "Content-Length: 5 5"),
        ("cl-empty", "Content-Length:"),
        ("cl-huge", "Content-Length: 99999999999999999999"),
        ("cl-unicode-digit", "Content-Length: \u{0663}"),
        ("cl-trailing-comma", "Content-Length: 5,"),
        (
            "te-chunked-twice-list",
            "Transfer-Encoding: chunked, chunked",
        ),
        (
            "te-chunked-twice-lines",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        ),
        ("te-gzip-chunked", "Transfer-Encoding: gzip, chunked"),
        ("te-chunked-gzip", "Transfer-Encoding: chunked, gzip"),
        ("te-identity", "Transfer-Encoding: identity"),
        (
            "te-chunked-identity",
            "Transfer-Encoding: chunked, identity",
        ),
        ("te-gzip", "Transfer-Encoding: gzip"),
        ("te-xchunked", "Transfer-Encoding: xchunked"),
        ("te-chunked-param", "Transfer-Encoding: chunked;q=1"),
        ("te-comma-only", "Transfer-Encoding: ,"),
        ("te-trailing-comma", "Transfer-Encoding: chunked,"),
        (
            "te-empty-second-line",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: ",
        ),
        ("te-vertical-tab", "Transfer-Encoding: \x0bchunked"),
        (
            "te-lines-chunked-then-gzip",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip",
        ),
        ("te-non-ascii", "Transfer-Encoding: \u{e9}, chunked"),
        ("te-space-before-colon", "Transfer-Encoding : chunked"),
        ("cl-space-before-colon", "Content-Length : 5"),
        ("te-obs-fold", "Transfer-Encoding: gzip,\r\n chunked"),
        (
            "te-expect-continue",
            "Expect: 100-continue\r\nContent-Length: 4\r\nTransfer-Encoding: chunked",
        ),
    ] {
        add(&format!("framing-{name}"), post(framing));
    }
    add(
        "framing-te-http10",
        b"POST /scan HTTP/1.0\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
    );

    // The request line.
    for (name, request_line) in [
        ("http2-as-text", "GET /scan HTTP/2.0"),
        ("preface", "PRI * HTTP/2.0"),
        ("http12", "GET /scan HTTP/1.2"),
        ("http3", "GET /scan HTTP/3"),
        ("http09", "GET /scan"),
        ("lowercase-version", "GET /scan http/1.1"),
        ("double-space", "GET  /scan HTTP/1.1"),
        ("trailing-word", "GET /scan HTTP/1.1 extra"),
        ("space-in-target", "GET /sc an HTTP/1.1"),
        ("bad-method-char", "G@T /scan HTTP/1.1"),
        ("empty-method", " /scan HTTP/1.1"),
        ("tab-separator", "GET\t/scan\tHTTP/1.1"),
    ] {
        add(&format!("line-{name}"), line(request_line));
    }
    add(
        "line-bare-cr",
        b"GET /scan HTTP/1.1\rHost: localhost\r\n\r\n".to_vec(),
    );
    add(
        "line-nul",
        b"GET /scan\x00 HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
    );
    add(
        "line-control-byte",
        b"GET /sc\x01an HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
    );
    add(
        "line-binary",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
    );

    // Header syntax and size.
    for (name, lines) in [
        ("space-in-name", "Host: localhost\r\nX Bad: 1"),
        ("empty-name", "Host: localhost\r\n: empty"),
        ("no-colon", "Host: localhost\r\nBad Header"),
        ("nul-in-value", "Host: localhost\r\nX-A: a\x00b"),
        ("cr-in-value", "Host: localhost\r\nX-A: a\rb"),
        ("name-trailing-space", "Host : localhost"),
        (
            "marker",
            "Host: localhost\r\nx-portcullis-refused: whatever",
        ),
    ] {
        add(&format!("header-{name}"), headers(lines));
    }
    add(
        "header-too-many",
        headers(&format!("Host: localhost{}", "\r\nX-A: b".repeat(101))),
    );
    add(
        "header-too-large",
        headers(&format!("Host: localhost\r\nX-Big: {}", "a".repeat(12_000))),
    );

    // Host (RFC 9112 §3.2): exactly one, valid, no userinfo.
    for (name, lines) in [
        ("missing", "X-A: 1"),
        ("twice", "Host: localhost\r\nHost: localhost"),
        ("twice-differ", "Host: localhost\r\nHost: evil.example"),
        ("empty", "Host:"),
        ("space", "Host: local host"),
        ("userinfo", "Host: user@localhost"),
        ("path", "Host: localhost/scan"),
        ("port-only", "Host: :80"),
        ("bad-port", "Host: localhost:99999"),
        ("port-word", "Host: localhost:http"),
        ("open-bracket", "Host: [::1"),
        ("comma-list", "Host: localhost, evil.example"),
    ] {
        add(&format!("host-{name}"), headers(lines));
    }
    add(
        "host-absolute-form-userinfo",
        target("http://user:pass@localhost/scan"),
    );

    // Targets routing would see.
    for (name, path) in [
        ("encoded-slash", "/scan%2Fsecure"),
        ("encoded-slash-lower", "/scan%2fsecure"),
        ("encoded-nul", "/scan%00"),
        ("malformed-percent", "/scan%zz"),
        ("truncated-percent", "/scan%4"),
        ("lone-percent", "/scan%"),
        ("climb-above-root", "/../scan"),
        ("climb-encoded", "/%2e%2e/%2e%2e/etc/passwd"),
        ("backslash", "/scan\\..\\secure"),
        ("encoded-control", "/scan%01"),
        ("dot-dot-parameters", "/public/..;/secure"),
        ("dot-parameters", "/public/.;x=1/secure"),
    ] {
        add(&format!("path-{name}"), target(path));
    }
    for (name, request_line) in [
        ("asterisk-get", "GET * HTTP/1.1"),
        ("relative", "GET scan HTTP/1.1"),
        ("authority-form-get", "GET localhost:80 HTTP/1.1"),
        ("connect", "CONNECT localhost:80 HTTP/1.1"),
        ("ftp-scheme", "GET ftp://localhost/scan HTTP/1.1"),
    ] {
        add(&format!("target-{name}"), line(request_line));
    }
    cases
}
