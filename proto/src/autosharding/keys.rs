//! steady's key space in A119's terms.
//!
//! steady routes by a 64-bit slice key, the XXH3-64 (seed 0) of the request's key
//! ([`SliceKey::of`]). A119 routes by byte strings in lexicographic order. The mapping:
//! **a request's A119 key is its slice key as 8 bytes, big-endian** ([`key_bytes`]), so
//! that byte order and numeric order agree and each steady slice `[start, end)` is the
//! A119 slice `[key_bytes(start), key_bytes(end))`, the first one starting at the empty
//! key and the last one open-ended. A client in another language computes XXH3-64 of its
//! key and sends the 8 bytes in the binary header [`KEY_HEADER`]; its A119 policy is
//! configured with that header as `key_header_name`.
//!
//! The other way, a byte string's place in steady's key space is [`slice_key_at`]: the
//! smallest 8-byte key at or after it.

use steady_slice::SliceKey;

/// The request header a client sends the A119 key in: 8 bytes, the big-endian slice key
/// (a binary header: gRPC sends it base64-encoded, as every `-bin` header). Beside it,
/// steady's own channel sends the key as text (`x-slice-key`).
pub const KEY_HEADER: &str = "x-slice-key-bin";

/// The A119 key of `key`: its 8 bytes, big-endian.
pub fn key_bytes(key: SliceKey) -> [u8; 8] {
    key.get().to_be_bytes()
}

/// Where the byte string `key` falls in steady's key space: the smallest 8-byte key at or
/// after it in byte order, as a slice key; `None` past the last one (a key longer than 8
/// bytes that starts with eight `0xFF` and goes on). A key of at most 8 bytes is padded
/// with zeros: `[0x80]` is `2^63`, and the empty key is 0.
pub fn slice_key_at(key: &[u8]) -> Option<SliceKey> {
    let mut bytes = [0u8; 8];
    let head = key.len().min(8);
    bytes[..head].copy_from_slice(&key[..head]);
    let value = u64::from_be_bytes(bytes);
    if key.len() > 8 && key[8..].iter().any(|&b| b != 0) {
        // Strictly after `value`'s own 8 bytes: the next 8-byte key.
        return value.checked_add(1).map(SliceKey);
    }
    Some(SliceKey(value))
}

/// The slice key a request's [`KEY_HEADER`] value carries: the header's value as it is
/// on the wire (base64 of the 8 bytes, as gRPC sends every `-bin` header, with or without
/// padding), decoded. `None` unless it decodes to exactly 8 bytes.
pub fn key_from_header(value: &[u8]) -> Option<SliceKey> {
    let trimmed = value.strip_suffix(b"=").unwrap_or(value);
    if trimmed.len() != 11 {
        return None;
    }
    // 11 characters of 6 bits: 66 bits, the last two of which must be zero.
    let mut bits: u128 = 0;
    for &c in trimmed {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u128::from(sextet);
    }
    if bits & 0b11 != 0 {
        return None;
    }
    u64::try_from(bits >> 2).ok().map(SliceKey)
}

/// The A119 form of a slice start: the empty key for the first slice (A119's slices
/// start at the empty key), else the 8 bytes.
pub fn start_bytes(start: SliceKey) -> Vec<u8> {
    if start == SliceKey::MIN {
        Vec::new()
    } else {
        key_bytes(start).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_its_slice_key_big_endian() {
        // A frozen contract: the reference XXH3-64 of the empty key, big-endian.
        assert_eq!(key_bytes(SliceKey::of(b"")), [0x2D, 0x06, 0x80, 0x05, 0x38, 0xD3, 0x94, 0xC2]);
        assert_eq!(key_bytes(SliceKey(0x0102_0304_0506_0708)), [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn the_header_carries_the_8_bytes_in_base64() {
        // base64 of 01 02 03 04 05 06 07 08 is "AQIDBAUGBwg=".
        assert_eq!(key_from_header(b"AQIDBAUGBwg="), Some(SliceKey(0x0102_0304_0506_0708)));
        assert_eq!(key_from_header(b"AQIDBAUGBwg"), Some(SliceKey(0x0102_0304_0506_0708)));
        assert_eq!(key_from_header(b"//////////8="), Some(SliceKey(u64::MAX)));
        assert_eq!(key_from_header(b"AAAAAAAAAAA="), Some(SliceKey(0)));
        for bad in [&b""[..], b"AQIDBAUGBw==", b"AQIDBAUGBwgJ", b"AQIDBAUG*wg=", b"AQIDBAUGBwh="] {
            assert_eq!(key_from_header(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn byte_order_and_key_order_agree() {
        let keys = [0u64, 1, 255, 256, 1 << 32, (1 << 63) - 1, 1 << 63, u64::MAX];
        for pair in keys.windows(2) {
            assert!(key_bytes(SliceKey(pair[0])) < key_bytes(SliceKey(pair[1])));
        }
    }

    #[test]
    fn a_byte_string_falls_at_the_smallest_key_not_before_it() {
        assert_eq!(slice_key_at(&[]), Some(SliceKey(0)));
        assert_eq!(slice_key_at(&[0x80]), Some(SliceKey(1 << 63)));
        assert_eq!(slice_key_at(&key_bytes(SliceKey(77))), Some(SliceKey(77)));
        assert_eq!(slice_key_at(&[0, 0, 0, 0, 0, 0, 0, 5, 0, 0]), Some(SliceKey(5)));
        assert_eq!(slice_key_at(&[0, 0, 0, 0, 0, 0, 0, 5, 1]), Some(SliceKey(6)));
        assert_eq!(slice_key_at(&[0xFF; 9]), None);
        assert_eq!(start_bytes(SliceKey(0)), Vec::<u8>::new());
        assert_eq!(start_bytes(SliceKey(1)), vec![0, 0, 0, 0, 0, 0, 0, 1]);
    }
}
