//! The default sealer: AES-256-GCM under a key the operator references,
//! a random 96-bit nonce per value, the context as associated data.
//! A sealed value reads `v1.KEYID.NONCE_AND_CIPHERTEXT` (base64url), where
//! KEYID names the key by the first bytes of its sha256, so a value sealed
//! under a key this node does not hold is known for that, not garbled.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::domain::{SecretValue, base64url, base64url_decode, sha256_hex};
use crate::ports::{SealError, Sealer};

/// Why a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not 32 bytes written as 64 hex digits.
    #[error("the sealing key must be 32 bytes written as 64 hexadecimal digits")]
    Malformed,
}

/// Seals under one key.
pub struct KeySealer {
    key: LessSafeKey,
    key_id: String,
    random: SystemRandom,
}

impl std::fmt::Debug for KeySealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySealer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl KeySealer {
    /// A sealer under `key`: 64 hex digits (`openssl rand -hex 32`).
    pub fn new(key: &SecretValue) -> Result<KeySealer, KeyError> {
        let text = key.reveal().trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError::Malformed);
        }
        let bytes: Vec<u8> = (0..32)
            .map(|index| u8::from_str_radix(&text[index * 2..index * 2 + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| KeyError::Malformed)?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeyError::Malformed)?;
        Ok(KeySealer {
            key: LessSafeKey::new(key),
            key_id: sha256_hex(&bytes)[..16].to_owned(),
            random: SystemRandom::new(),
        })
    }
}

impl Sealer for KeySealer {
    fn seal(&self, context: &[u8], plain: &SecretValue) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| SealError::Randomness)?;
        let mut sealed = plain.reveal().as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context),
                &mut sealed,
            )
            .map_err(|_| SealError::Unopenable)?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(format!("v1.{}.{}", self.key_id, base64url(&bytes)))
    }

    fn open(&self, context: &[u8], sealed: &str) -> Result<SecretValue, SealError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some("v1"), Some(key_id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Unopenable);
        };
        if key_id != self.key_id {
            return Err(SealError::Unopenable);
        }
        let mut bytes = base64url_decode(body).ok_or(SealError::Unopenable)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Unopenable);
        }
        let mut ciphertext = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| SealError::Unopenable)?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context), &mut ciphertext)
            .map_err(|_| SealError::Unopenable)?;
        let text = std::str::from_utf8(plain).map_err(|_| SealError::Unopenable)?;
        Ok(SecretValue::new(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(digit: char) -> KeySealer {
        KeySealer::new(&SecretValue::new(digit.to_string().repeat(64))).unwrap()
    }

    /// A value opens only under its key and its context; the text kept
    /// holds nothing of it.
    #[test]
    fn a_value_opens_only_under_its_key_and_context() {
        let sealer = sealer('a');
        let plain = SecretValue::new("access-token-abc");
        let sealed = sealer.seal(b"acme\0alice\0crm", &plain).unwrap();
        assert!(!sealed.contains("access-token"), "{sealed}");
        assert_eq!(sealer.open(b"acme\0alice\0crm", &sealed).unwrap(), plain);
        assert_ne!(sealer.seal(b"acme\0alice\0crm", &plain).unwrap(), sealed);
        assert_eq!(
            sealer.open(b"acme\0mallory\0crm", &sealed),
            Err(SealError::Unopenable)
        );
        assert_eq!(
            super::tests::sealer('b').open(b"acme\0alice\0crm", &sealed),
            Err(SealError::Unopenable)
        );
        // A character inside the body changed: every one of its bits is
        // the ciphertext's (the last one's lowest may be padding). Each
        // seal has its own nonce, so many are tried.
        for _ in 0..200 {
            let sealed = sealer.seal(b"acme\0alice\0crm", &plain).unwrap();
            let mut flipped = sealed.into_bytes();
            let middle = flipped.len() - 10;
            flipped[middle] = if flipped[middle] == b'A' { b'B' } else { b'A' };
            let flipped = String::from_utf8(flipped).unwrap();
            assert_eq!(
                sealer.open(b"acme\0alice\0crm", &flipped),
                Err(SealError::Unopenable)
            );
        }
        for garbage in ["", "v1", "v1..", "v2.x.y", "v1.0000.%%%", &sealed[..20]] {
            assert_eq!(
                sealer.open(b"acme\0alice\0crm", garbage),
                Err(SealError::Unopenable),
                "{garbage}"
            );
        }
    }

    #[test]
    fn a_key_is_32_bytes_of_hex() {
        for key in ["", "abc", &"g".repeat(64), &"a".repeat(63), &"a".repeat(66)] {
            assert_eq!(
                KeySealer::new(&SecretValue::new(key)).unwrap_err(),
                KeyError::Malformed
            );
        }
        assert!(KeySealer::new(&SecretValue::new(format!("{}\n", "0".repeat(64)))).is_ok());
    }
}
