//! Which addresses a tool may reach: only public unicast ones.
//!
//! [`refusal`] names the class of every address a request must never be sent to — loopback,
//! private, carrier-grade NAT, link-local (the cloud metadata address 169.254.169.254 among
//! them), unique-local, multicast, broadcast, unspecified, documentation and benchmarking
//! ranges, reserved space — and looks through the IPv6 forms that carry an IPv4 address
//! (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4
//! `2002::/16`), so a private IPv4 address cannot be reached under an IPv6 name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a tool may not send a request to `ip`, or `None` when it is a public unicast address.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4),
        IpAddr::V6(v6) => refusal_v6(v6),
    }
}

/// Whether `ip` is a loopback address (in any of its forms): the one class a testing
/// exception (`--net-allow-loopback`) lets through.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || embedded_v4(v6).is_some_and(|v4| v4.is_loopback()),
    }
}

fn refusal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified (0.0.0.0/8)",
        (10, _, _) => "private (10.0.0.0/8)",
        (100, 64..=127, _) => "carrier-grade NAT (100.64.0.0/10)",
        (127, _, _) => "loopback (127.0.0.0/8)",
        (169, 254, _) => "link-local (169.254.0.0/16, cloud metadata among it)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (192, 0, 2) => "documentation (192.0.2.0/24)",
        (192, 88, 99) => "6to4 relay anycast (192.88.99.0/24)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
        (198, 51, 100) => "documentation (198.51.100.0/24)",
        (203, 0, 113) => "documentation (203.0.113.0/24)",
        (224..=239, _, _) => "multicast (224.0.0.0/4)",
        (255, 255, 255) if ip.is_broadcast() => "broadcast (255.255.255.255)",
        (240..=255, _, _) => "reserved (240.0.0.0/4)",
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address carries, in the forms that route to it.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // IPv4-mapped ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        // IPv4-compatible ::a.b.c.d (deprecated; `::` and `::1` are not of this form)
        [0, 0, 0, 0, 0, 0, _, _] if s[6] != 0 => Some(low),
        // NAT64 well-known prefix 64:ff9b::/96
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        // 6to4 2002:AABB:CCDD::/48
        [0x2002, hi, lo, ..] => {
            Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8))
        }
        _ => None,
    }
}

fn refusal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    if let Some(v4) = embedded_v4(ip) {
        // A public IPv4 address under an IPv6 form is still refused: keel connects to the
        // address a name resolves to, and these forms exist to reach IPv4 space indirectly.
        return Some(match refusal_v4(v4) {
            Some(_) => "an IPv6 form of a refused IPv4 address",
            None => "an IPv6 form of an IPv4 address (connect to the IPv4 address instead)",
        });
    }
    let s = ip.segments();
    Some(match s[0] {
        0xfc00..=0xfdff => "unique-local (fc00::/7)",
        0xfe80..=0xfebf => "link-local (fe80::/10)",
        0xfec0..=0xfeff => "site-local (fec0::/10, deprecated)",
        0xff00..=0xffff => "multicast (ff00::/8)",
        0x2001 if s[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x2001 if s[1] < 0x0200 => "IETF protocol assignments (2001::/23)",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        0x3fff if s[1] < 0x1000 => "documentation (3fff::/20)",
        0x0000..=0x1fff => "reserved (outside 2000::/3)",
        0x4000..=0xfbff => "reserved (outside 2000::/3)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> bool {
        refusal(s.parse().unwrap()).is_some()
    }

    #[test]
    fn every_refused_ipv4_range_is_refused_at_both_ends() {
        for (first, last) in [
            ("0.0.0.0", "0.255.255.255"),
            ("10.0.0.0", "10.255.255.255"),
            ("100.64.0.0", "100.127.255.255"),
            ("127.0.0.0", "127.255.255.255"),
            ("169.254.0.0", "169.254.255.255"),
            ("172.16.0.0", "172.31.255.255"),
            ("192.0.0.0", "192.0.0.255"),
            ("192.0.2.0", "192.0.2.255"),
            ("192.88.99.0", "192.88.99.255"),
            ("192.168.0.0", "192.168.255.255"),
            ("198.18.0.0", "198.19.255.255"),
            ("198.51.100.0", "198.51.100.255"),
            ("203.0.113.0", "203.0.113.255"),
            ("224.0.0.0", "239.255.255.255"),
            ("240.0.0.0", "255.255.255.254"),
            ("255.255.255.255", "255.255.255.255"),
        ] {
            assert!(refused(first), "{first}");
            assert!(refused(last), "{last}");
        }
        assert!(refusal("169.254.169.254".parse().unwrap()).unwrap().contains("metadata"));
    }

    #[test]
    fn public_ipv4_addresses_next_to_the_ranges_pass() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.0.3.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            assert!(!refused(ip), "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges_and_the_forms_that_carry_ipv4_are_refused() {
        for ip in [
            "::",
            "::1",
            "fc00::1",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "100::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:8.8.8.8",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::808:808",
            "2002:7f00:1::",
            "2002:0808:0808::1",
            "3fff::1",
        ] {
            assert!(refused(ip), "{ip}");
        }
        for ip in ["2606:4700:4700::1111", "2a00:1450:4001::200e", "2600::"] {
            assert!(!refused(ip), "{ip}");
        }
    }

    #[test]
    fn loopback_is_recognised_in_every_form() {
        for ip in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "64:ff9b::7f00:1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "::ffff:10.0.0.1", "8.8.8.8", "fe80::1"] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }
}
