//! Sealed cookies for the console: the login in progress and the session live in the browser,
//! encrypted and authenticated, so the console keeps no server-side session store and any
//! replica can serve any request.
//!
//! A value is `base64url(expiry ‖ nonce ‖ AES-256-GCM(payload))`. The cookie's name and the
//! expiry are bound in as associated data: a value cannot be moved to another cookie (a login
//! cookie replayed as a session cookie) and its expiry cannot be extended, although the expiry
//! travels in clear so an expired value is refused before any decryption.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom as _, SystemRandom};

/// The least key material accepted: 256 bits, the strength of the AES key derived from it.
pub const MIN_KEY_LEN: usize = 32;

/// Bytes of the clear expiry at the start of a value (unix seconds, big-endian).
const EXPIRY_LEN: usize = 8;
/// The GCM tag's length.
const TAG_LEN: usize = 16;
/// Values longer than this are refused unread: browsers keep ~4 KiB per cookie anyway, and a
/// bound keeps a hostile header from costing more than a small decode.
const MAX_VALUE_LEN: usize = 8 * 1024;
/// Domain separation for the key derivation, so the same key material used elsewhere (it
/// should not be, but might) yields an unrelated key here.
const HKDF_SALT: &[u8] = b"raypipe console cookie key v1";
const HKDF_INFO: &[u8] = b"aes-256-gcm";
/// Prefix of the associated data: a version, so a future format cannot be confused with this one.
const AAD_PREFIX: &[u8] = b"raypipe-cookie-v1\0";

#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    #[error("the cookie key material is {len} bytes; at least {MIN_KEY_LEN} are required")]
    KeyTooShort { len: usize },
    #[error("the system random number generator failed")]
    Random,
}

/// The key that seals and opens the console's cookies. Its Debug output never shows the key.
#[derive(Clone)]
pub struct CookieKey {
    /// The AES-256 key derived from the key material (HKDF-SHA256), so material of any length
    /// of at least 32 bytes (a random file, a long passphrase-like secret) works.
    aes_key: [u8; 32],
}

impl fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CookieKey(<redacted>)")
    }
}

impl CookieKey {
    /// A key from at least [`MIN_KEY_LEN`] bytes of secret material (e.g. a Kubernetes Secret
    /// shared by every replica, so sessions survive restarts and load balancing).
    pub fn from_bytes(material: &[u8]) -> Result<CookieKey, CookieError> {
        if material.len() < MIN_KEY_LEN {
            return Err(CookieError::KeyTooShort {
                len: material.len(),
            });
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(material);
        let mut aes_key = [0u8; 32];
        prk.expand(&[HKDF_INFO], hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut aes_key))
            .map_err(|_| CookieError::Random)?;
        Ok(CookieKey { aes_key })
    }

    /// A fresh random key: sessions then last as long as this process (fine for one replica
    /// and for `raypipe dev`).
    pub fn generate() -> Result<CookieKey, CookieError> {
        let mut material = [0u8; 32];
        SystemRandom::new()
            .fill(&mut material)
            .map_err(|_| CookieError::Random)?;
        CookieKey::from_bytes(&material)
    }

    fn aead(&self) -> LessSafeKey {
        // Cannot fail: the key has exactly AES-256's length.
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.aes_key).expect("a 32-byte key"))
    }

    /// Seals `payload` for the cookie `name`, valid until `now + ttl` (unix seconds).
    ///
    /// Panics only if the system random number generator fails, where nothing secure can
    /// be done anyway.
    pub fn seal(&self, name: &str, payload: &[u8], now: i64, ttl: Duration) -> String {
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let expiry = now.saturating_add(ttl);
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the system random number generator failed");
        let mut sealed = payload.to_vec();
        self.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(name, expiry)),
                &mut sealed,
            )
            .expect("AES-GCM sealing of a cookie-sized payload");
        let mut raw = Vec::with_capacity(EXPIRY_LEN + NONCE_LEN + sealed.len());
        raw.extend_from_slice(&expiry.to_be_bytes());
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// The payload sealed in `value` for the cookie `name`; `None` when the value is
    /// malformed, tampered with, sealed for another cookie or with another key, or expired at
    /// `now` (unix seconds). Never panics, whatever the input.
    pub fn open(&self, name: &str, value: &str, now: i64) -> Option<Vec<u8>> {
        if value.len() > MAX_VALUE_LEN {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(value.trim()).ok()?;
        if raw.len() < EXPIRY_LEN + NONCE_LEN + TAG_LEN {
            return None;
        }
        let (expiry, rest) = raw.split_at(EXPIRY_LEN);
        let expiry = i64::from_be_bytes(expiry.try_into().ok()?);
        if expiry <= now {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .aead()
            .open_in_place(nonce, Aad::from(associated_data(name, expiry)), &mut in_out)
            .ok()?;
        Some(plain.to_vec())
    }
}

fn associated_data(name: &str, expiry: i64) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_PREFIX.len() + name.len() + 1 + EXPIRY_LEN);
    aad.extend_from_slice(AAD_PREFIX);
    aad.extend_from_slice(name.as_bytes());
    // The separator keeps (name, expiry) pairs from colliding; names hold no NUL.
    aad.push(0);
    aad.extend_from_slice(&expiry.to_be_bytes());
    aad
}

/// A `Set-Cookie` header value: `HttpOnly` so page scripts cannot read the session,
/// `SameSite=Lax` so cross-site POSTs do not carry it (while the IdP's redirect back, a
/// top-level GET, does), `Path=/`, and `Secure` when the console is served over HTTPS.
///
/// `value` must already be cookie-safe (sealed values are base64url).
pub fn set_cookie(name: &str, value: &str, max_age: Duration, secure: bool) -> String {
    let mut header = format!(
        "{name}={value}; Max-Age={}; Path=/; HttpOnly; SameSite=Lax",
        max_age.as_secs()
    );
    if secure {
        header.push_str("; Secure");
    }
    header
}

/// A `Set-Cookie` header value that deletes the cookie `name` (empty, `Max-Age=0`), with the
/// same attributes as [`set_cookie`] so the browser matches it to the cookie it holds.
pub fn clear_cookie(name: &str, secure: bool) -> String {
    set_cookie(name, "", Duration::ZERO, secure)
}

#[cfg(test)]
#[path = "cookie_tests.rs"]
mod tests;
