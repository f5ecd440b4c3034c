//! sha256 digests in the `sha256:<hex>` form that status fields and pins use.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A sha256 digest. Displays as `sha256:<lowercase hex>`; parses that form or bare hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// The prefix of the canonical text form.
    pub const PREFIX: &'static str = "sha256:";

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// Finishes an incremental hash (used while streaming a body).
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex without the prefix.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.to_hex())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The text is not a sha256 digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected 64 hex digits, optionally prefixed by `sha256:`")]
pub struct Sha256ParseError;

impl FromStr for Sha256Digest {
    type Err = Sha256ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let hex_digits = text.strip_prefix(Self::PREFIX).unwrap_or(text);
        if hex_digits.len() != 64 {
            return Err(Sha256ParseError);
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut bytes).map_err(|_| Sha256ParseError)?;
        Ok(Self(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // sha256("abc"), from FIPS 180-2 appendix B.1.
    const ABC_HEX: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn digest_of_known_input_matches_the_standard_vector() {
        assert_eq!(Sha256Digest::of(b"abc").to_hex(), ABC_HEX);
        assert_eq!(
            Sha256Digest::of(b"abc").to_string(),
            format!("sha256:{ABC_HEX}")
        );
    }

    #[test]
    fn incremental_hash_equals_one_shot_hash() {
        let mut hasher = Sha256::new();
        hasher.update(b"a");
        hasher.update(b"bc");
        assert_eq!(Sha256Digest::from_hasher(hasher), Sha256Digest::of(b"abc"));
    }

    #[test]
    fn parses_prefixed_bare_and_uppercase_hex() {
        let expected = Sha256Digest::of(b"abc");
        assert_eq!(format!("sha256:{ABC_HEX}").parse(), Ok(expected));
        assert_eq!(ABC_HEX.parse(), Ok(expected));
        assert_eq!(ABC_HEX.to_uppercase().parse(), Ok(expected));
        assert_eq!(format!("  {ABC_HEX}\n").parse(), Ok(expected));
    }

    #[test]
    fn rejects_wrong_length_non_hex_and_other_algorithms() {
        for bad in [
            "",
            "sha256:",
            &ABC_HEX[..63],
            &format!("{ABC_HEX}00"),
            &format!("sha512:{ABC_HEX}"),
            &ABC_HEX.replace('b', "g"),
        ] {
            assert_eq!(
                bad.parse::<Sha256Digest>(),
                Err(Sha256ParseError),
                "{bad:?}"
            );
        }
    }
}
