//! URLs as they may appear in messages and logs: userinfo and query strings can hold
//! credentials (basic auth, presigned signatures), so both are dropped, and the fragment too.

use reqwest::Url;

/// Longest URL text put into a message; condition messages should stay readable.
const MAX_SHOWN_LEN: usize = 256;

/// `url` without userinfo, query string or fragment.
pub fn redact_url(url: &Url) -> String {
    let mut shown = url.clone();
    // Both fail only for URLs that cannot have userinfo, which then have none to remove.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    truncate(shown.into())
}

/// Best-effort redaction of text that did not parse as a URL, for "invalid URL" messages.
pub(crate) fn redact_unparsed_url(text: &str) -> String {
    let text = text.trim();
    let without_query = text.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = match without_query.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, without_query),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let shown: String = match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    };
    // Control characters would garble a log line or a condition message.
    truncate(shown.chars().filter(|c| !c.is_control()).collect())
}

fn truncate(mut text: String) -> String {
    if text.len() > MAX_SHOWN_LEN {
        let mut cut = MAX_SHOWN_LEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        redact_url(&Url::parse(text).expect("test URL parses"))
    }

    #[test]
    fn drops_userinfo_query_and_fragment() {
        assert_eq!(
            shown("https://alice:hunter2@registry.example:8443/models/g.pb?X-Sig=abc&token=t#frag"),
            "https://registry.example:8443/models/g.pb"
        );
        assert_eq!(shown("https://alice@h/p"), "https://h/p");
        assert_eq!(shown("http://h/p?"), "http://h/p");
    }

    #[test]
    fn keeps_a_clean_url_as_it_is() {
        assert_eq!(shown("https://h:1/a/b.pb"), "https://h:1/a/b.pb");
    }

    #[test]
    fn redacts_text_that_is_not_a_url() {
        assert_eq!(
            redact_unparsed_url("https://u:secret@exa mple/p?q=secret"),
            "https://exa mple/p"
        );
        assert_eq!(
            redact_unparsed_url("u:secret@host:99999/x#secret"),
            "host:99999/x"
        );
        assert_eq!(redact_unparsed_url("ftp://h/\u{7}p"), "ftp://h/p");
        assert_eq!(redact_unparsed_url(""), "");
    }

    #[test]
    fn long_urls_are_shortened_on_a_char_boundary() {
        let long = format!("https://h/{}", "é".repeat(400));
        let redacted = redact_unparsed_url(&long);
        assert!(redacted.len() <= MAX_SHOWN_LEN + '…'.len_utf8());
        assert!(redacted.ends_with('…'));
    }
}
