//! Pure validation shared by the controllers, the webhook and the CLI: no client, no I/O.
//! Everything here reads untrusted input (custom resources, annotations, flags) and answers
//! with a value or a named error, never a panic.

pub mod duration;
pub mod feature_gates;
pub mod servepipeline;

pub use duration::{DurationError, parse_bounded, parse_duration, parse_go_duration};

/// Untrusted text cut to at most `max` bytes on a char boundary, marked with `…` when cut: for
/// quoting input back in errors, logs and conditions without letting it grow them.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn cut_keeps_short_text_and_bounds_long_text_on_char_boundaries() {
        assert_eq!(cut("short", 10), "short");
        for max in 0..20 {
            let out = cut("ééééééééééééééé", max);
            assert!(out.len() <= max.max('…'.len_utf8()), "{max}: {out}");
        }
    }
}
