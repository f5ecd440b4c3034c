use std::time::Duration;

use proptest::prelude::*;

use super::*;

const NOW: i64 = 1_800_000_000;
const HOUR: Duration = Duration::from_secs(3600);

fn key() -> CookieKey {
    CookieKey::from_bytes(&[7u8; 32]).unwrap()
}

#[test]
fn round_trip() {
    let key = key();
    let value = key.seal("session", b"alice", NOW, HOUR);
    assert_eq!(
        key.open("session", &value, NOW).as_deref(),
        Some(&b"alice"[..])
    );
    assert_eq!(
        key.open("session", &value, NOW + 3599).as_deref(),
        Some(&b"alice"[..])
    );
    // Cookie-safe: url-safe base64 without padding.
    assert!(
        value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
}

#[test]
fn empty_payload_round_trips() {
    let key = key();
    let value = key.seal("c", b"", NOW, HOUR);
    assert_eq!(key.open("c", &value, NOW), Some(Vec::new()));
}

#[test]
fn each_value_uses_a_fresh_nonce() {
    let key = key();
    assert_ne!(
        key.seal("session", b"x", NOW, HOUR),
        key.seal("session", b"x", NOW, HOUR)
    );
}

#[test]
fn flipping_any_byte_is_refused() {
    let key = key();
    let value = key.seal("session", b"alice and her groups", NOW, HOUR);
    let raw = URL_SAFE_NO_PAD.decode(&value).unwrap();
    for index in 0..raw.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut tampered = raw.clone();
            tampered[index] ^= flip;
            let tampered = URL_SAFE_NO_PAD.encode(tampered);
            assert_eq!(
                key.open("session", &tampered, NOW),
                None,
                "byte {index} ^ {flip:#x}"
            );
        }
    }
    // Truncated or extended values too.
    assert_eq!(key.open("session", &value[..value.len() - 1], NOW), None);
    assert_eq!(key.open("session", &format!("{value}AA"), NOW), None);
}

#[test]
fn another_cookie_name_is_refused() {
    let key = key();
    let value = key.seal("login", b"pending", NOW, HOUR);
    assert_eq!(key.open("session", &value, NOW), None);
    assert_eq!(key.open("logi", &value, NOW), None);
}

#[test]
fn another_key_is_refused() {
    let value = key().seal("session", b"alice", NOW, HOUR);
    let other = CookieKey::from_bytes(&[8u8; 32]).unwrap();
    assert_eq!(other.open("session", &value, NOW), None);
    let generated = CookieKey::generate().unwrap();
    assert_eq!(generated.open("session", &value, NOW), None);
}

#[test]
fn expired_values_are_refused() {
    let key = key();
    let value = key.seal("session", b"alice", NOW, HOUR);
    assert_eq!(key.open("session", &value, NOW + 3600), None);
    assert_eq!(key.open("session", &value, NOW + 100_000), None);
    let zero = key.seal("session", b"alice", NOW, Duration::ZERO);
    assert_eq!(key.open("session", &zero, NOW), None);
}

#[test]
fn extending_the_clear_expiry_is_refused() {
    let key = key();
    let value = key.seal("session", b"alice", NOW, HOUR);
    let mut raw = URL_SAFE_NO_PAD.decode(&value).unwrap();
    raw[..8].copy_from_slice(&(NOW + 10 * 3600).to_be_bytes());
    let extended = URL_SAFE_NO_PAD.encode(raw);
    assert_eq!(key.open("session", &extended, NOW + 2 * 3600), None);
}

#[test]
fn short_key_material_is_refused() {
    let error = CookieKey::from_bytes(&[1u8; 31]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the cookie key material is 31 bytes; at least 32 are required"
    );
    assert!(CookieKey::from_bytes(&[]).is_err());
    // Longer material is fine.
    assert!(CookieKey::from_bytes(&[1u8; 100]).is_ok());
}

#[test]
fn key_material_length_matters() {
    // 32 and 33 bytes of the same value derive different keys.
    let value = CookieKey::from_bytes(&[1u8; 32])
        .unwrap()
        .seal("s", b"x", NOW, HOUR);
    let longer = CookieKey::from_bytes(&[1u8; 33]).unwrap();
    assert_eq!(longer.open("s", &value, NOW), None);
}

#[test]
fn debug_hides_the_key() {
    let shown = format!("{:?}", key());
    assert_eq!(shown, "CookieKey(<redacted>)");
}

#[test]
fn garbage_is_refused() {
    let key = key();
    for value in [
        "",
        "=",
        "!!!!",
        "AAAA",
        "A",
        "%00",
        "not base64 at all",
        &"A".repeat(10_000),
        &"A".repeat(48),
    ] {
        assert_eq!(key.open("session", value, NOW), None, "{value:?}");
    }
}

#[test]
fn set_cookie_attributes() {
    assert_eq!(
        set_cookie("session", "abc", HOUR, true),
        "session=abc; Max-Age=3600; Path=/; HttpOnly; SameSite=Lax; Secure"
    );
    assert_eq!(
        set_cookie("session", "abc", HOUR, false),
        "session=abc; Max-Age=3600; Path=/; HttpOnly; SameSite=Lax"
    );
    assert_eq!(
        clear_cookie("session", true),
        "session=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax; Secure"
    );
}

proptest! {
    #[test]
    fn open_never_panics_on_arbitrary_strings(value in ".{0,300}", name in "[a-z]{0,10}") {
        let _ = key().open(&name, &value, NOW);
    }

    #[test]
    fn open_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let value = URL_SAFE_NO_PAD.encode(&bytes);
        // Random bytes are never a valid sealed value.
        prop_assert_eq!(key().open("session", &value, i64::MIN), None);
    }

    #[test]
    fn any_payload_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..500)) {
        let key = key();
        let value = key.seal("session", &payload, NOW, HOUR);
        prop_assert_eq!(key.open("session", &value, NOW), Some(payload));
    }
}
