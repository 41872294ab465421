//! PII redaction: e-mail addresses, public IPv4 and IPv6 addresses, phone numbers and credit-card
//! numbers are replaced by `<EMAIL>`, `<IP_ADDRESS>`, `<PHONE_NUMBER>` and `<CREDIT_CARD>`, and
//! counted.
//!
//! Rules that keep false positives down, because every redaction destroys text:
//! - IP addresses are redacted only when public: private (10/8, 172.16/12, 192.168/16),
//!   loopback, link-local, shared (100.64/10), documentation, benchmarking, multicast, reserved
//!   (240/4), "this network" (0/8) and broadcast stay, as they identify no one.
//! - IPv6 likewise ([`is_public_ipv6`]): only global unicast (2000::/3) outside the IANA
//!   special-purpose blocks, and IPv4-mapped or -compatible forms by their IPv4 address. A run
//!   of hex digits, colons and dots must parse as an address as a whole (`std::net`), so C++'s
//!   `std::vector`, times like `12:30:45` and MAC addresses stay.
//! - Card numbers (13-19 digits, optionally grouped by spaces or dashes) must pass the Luhn check.
//! - Phone numbers need 10-15 digits and either a leading `+` or separators between groups, so a
//!   bare run of digits (an id, a count) is left alone.
//!
//! What it is not: postal addresses or names; these need a model, not patterns.
//! Order matters: cards go first so a grouped card number is not taken for a phone number, and
//! IPv6 before IPv4 so that `::ffff:8.8.8.8` goes whole.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde::Deserialize;

use super::document::{Document, Event, Events, Verdict};

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b[a-z0-9][a-z0-9._%+-]*@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b")
        .expect("email regex")
});
static IPV4: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(?:\d{1,3}\.){3}\d{1,3}\b").expect("ipv4 regex"));
/// Maximal runs of hex digits, colons and dots holding at least two colons: the candidates
/// for an IPv6 address, each then parsed whole (a trailing sentence dot aside).
static IPV6: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*").expect("ipv6 regex")
});
static CARD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b\d(?:[ -]?\d){12,18}\b").expect("card regex"));
static PHONE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{1,4}[ .-])(?:\d{2,4}[ .-]){1,3}\d{2,4}\b",
    )
    .expect("phone regex")
});

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PiiFile {
    pub emails: bool,
    pub ip_addresses: bool,
    pub phone_numbers: bool,
    pub credit_cards: bool,
}

impl Default for PiiFile {
    fn default() -> Self {
        PiiFile {
            emails: true,
            ip_addresses: true,
            phone_numbers: true,
            credit_cards: true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct PiiRedactor {
    file: PiiFile,
}

impl PiiFile {
    pub fn validate(self) -> Result<PiiRedactor, String> {
        if !(self.emails || self.ip_addresses || self.phone_numbers || self.credit_cards) {
            return Err("pii stage has every kind switched off; remove the stage instead".into());
        }
        Ok(PiiRedactor { file: self })
    }
}

/// True for addresses that can identify a host on the public internet.
pub fn is_public_ipv4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || ip.is_unspecified()
        || a == 0
        || a >= 240
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || (a == 192 && b == 0 && c == 0))
}

/// True for IPv6 addresses that can identify a host on the public internet: global unicast
/// (2000::/3) outside the IANA special-purpose blocks within it (IETF protocol assignments
/// 2001::/23, documentation 2001:db8::/32 and 3fff::/20, 6to4 2002::/16), and IPv4-mapped
/// (`::ffff:a.b.c.d`) or -compatible (`::a.b.c.d`) addresses whose IPv4 address is public.
/// Loopback, unspecified, unique-local, link-local, multicast and the reserved rest stay.
pub fn is_public_ipv6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && s[6] != 0)) {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return is_public_ipv4(Ipv4Addr::new(a, b, c, d));
    }
    let global_unicast = s[0] & 0xe000 == 0x2000;
    let ietf_protocol = s[0] == 0x2001 && s[1] < 0x0200;
    let documentation = (s[0] == 0x2001 && s[1] == 0x0db8) || s[0] & 0xfff0 == 0x3ff0;
    let six_to_four = s[0] == 0x2002;
    global_unicast && !ietf_protocol && !documentation && !six_to_four
}

/// Redacts the public IPv6 addresses among the [`IPV6`] candidates (a trailing `.` stays, as
/// the end of a sentence).
fn redact_ipv6(text: &str, count: &mut u64) -> Option<String> {
    if !text.contains("::") && text.matches(':').count() < 7 {
        return None;
    }
    let mut changed = false;
    let out = IPV6.replace_all(text, |caps: &Captures| {
        let found = &caps[0];
        let address = found.trim_end_matches('.');
        if address.parse::<Ipv6Addr>().is_ok_and(is_public_ipv6) {
            *count += 1;
            changed = true;
            format!("<IP_ADDRESS>{}", &found[address.len()..])
        } else {
            found.to_string()
        }
    });
    changed.then(|| out.into_owned())
}

/// The Luhn checksum over the digits of `number` (other characters ignored); the 13-19 digit
/// length of a card is the regex's job.
pub fn luhn_valid(number: &str) -> bool {
    let digits: Vec<u32> = number.chars().filter_map(|c| c.to_digit(10)).collect();
    if digits.len() < 2 {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                if d * 2 > 9 { d * 2 - 9 } else { d * 2 }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

fn redact(
    text: &str,
    pattern: &Regex,
    placeholder: &str,
    accept: impl Fn(&str) -> bool,
    count: &mut u64,
) -> Option<String> {
    let mut changed = false;
    let out = pattern.replace_all(text, |caps: &Captures| {
        let found = &caps[0];
        if accept(found) {
            *count += 1;
            changed = true;
            placeholder.to_string()
        } else {
            found.to_string()
        }
    });
    changed.then(|| out.into_owned())
}

impl PiiRedactor {
    pub fn apply(&self, mut doc: Document, events: &mut Events) -> Verdict {
        let f = &self.file;
        let mut counts = [0u64; 4];
        let mut text = std::mem::take(&mut doc.text);
        if f.credit_cards
            && let Some(t) = redact(&text, &CARD, "<CREDIT_CARD>", luhn_valid, &mut counts[0])
        {
            text = t;
        }
        if f.emails
            && text.contains('@')
            && let Some(t) = redact(&text, &EMAIL, "<EMAIL>", |_| true, &mut counts[1])
        {
            text = t;
        }
        if f.ip_addresses
            && let Some(t) = redact_ipv6(&text, &mut counts[2])
        {
            text = t;
        }
        if f.ip_addresses
            && let Some(t) = redact(
                &text,
                &IPV4,
                "<IP_ADDRESS>",
                |s| s.parse::<Ipv4Addr>().is_ok_and(is_public_ipv4),
                &mut counts[2],
            )
        {
            text = t;
        }
        if f.phone_numbers
            && let Some(t) = redact(
                &text,
                &PHONE,
                "<PHONE_NUMBER>",
                |s| (10..=15).contains(&s.chars().filter(char::is_ascii_digit).count()),
                &mut counts[3],
            )
        {
            text = t;
        }
        doc.text = text;
        let kinds = [
            Event::CreditCardRedacted,
            Event::EmailRedacted,
            Event::IpAddressRedacted,
            Event::PhoneNumberRedacted,
        ];
        for (kind, count) in kinds.into_iter().zip(counts) {
            if count > 0 {
                events.push((kind, count));
            }
        }
        if counts.iter().any(|&c| c > 0) {
            events.push((Event::DocumentModified, 1));
        }
        Verdict::Keep(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact_text(text: &str) -> (String, Events) {
        let stage = PiiFile::default().validate().unwrap();
        let mut events = Vec::new();
        match stage.apply(Document::plain("d", text, "s"), &mut events) {
            Verdict::Keep(doc) => (doc.text, events),
            Verdict::Drop(..) => panic!("pii never drops"),
        }
    }

    #[test]
    fn emails_are_redacted_and_counted() {
        let (text, events) = redact_text("write to jane.doe+x@mail.example.org or bob@ex.co now");
        assert_eq!(text, "write to <EMAIL> or <EMAIL> now");
        assert!(events.contains(&(Event::EmailRedacted, 2)));
    }

    #[test]
    fn only_public_ips_are_redacted() {
        let (text, _) = redact_text(
            "hosts 8.8.8.8, 192.168.1.1, 10.0.0.7, 127.0.0.1, 100.64.0.1 and 172.217.3.4",
        );
        assert_eq!(
            text,
            "hosts <IP_ADDRESS>, 192.168.1.1, 10.0.0.7, 127.0.0.1, 100.64.0.1 and <IP_ADDRESS>"
        );
        let (text, _) = redact_text("version 999.1.2.3 is not an address");
        assert_eq!(text, "version 999.1.2.3 is not an address");
    }

    #[test]
    fn only_public_ipv6_addresses_are_redacted() {
        let (text, events) = redact_text(
            "dns 2001:4860:4860::8888, host 2a03:2880:f12f:83:face:b00c:0:25de. mapped \
             ::ffff:8.8.8.8 and [2606:4700:4700::1111]:53",
        );
        assert_eq!(
            text,
            "dns <IP_ADDRESS>, host <IP_ADDRESS>. mapped <IP_ADDRESS> and [<IP_ADDRESS>]:53"
        );
        assert!(events.contains(&(Event::IpAddressRedacted, 4)));
        let kept = "loopback ::1, any ::, doc 2001:db8::1, 3fff::5, link fe80::1%eth0, ula \
                    fd12:3456:789a::1, mcast ff02::1, 6to4 2002:c000:204::1, teredo 2001::1, \
                    mapped ::ffff:192.168.1.1, std::vector<int>, Foo::Bar, at 12:30:45, mac \
                    00:1a:2b:3c:4d:5e, ratio 3:2:1 and 2001:4860:4860::8888:1:2:3:4 (too long)";
        let (text, events) = redact_text(kept);
        assert_eq!(text, kept);
        assert!(events.is_empty(), "{events:?}");
        assert!(is_public_ipv6("2001:4860::1".parse().unwrap()));
        assert!(!is_public_ipv6("2001:db8::1".parse().unwrap()));
        assert!(!is_public_ipv6("::ffff:10.1.2.3".parse().unwrap()));
        assert!(is_public_ipv6("::ffff:1.1.1.1".parse().unwrap()));
    }

    #[test]
    fn credit_cards_need_a_valid_luhn_checksum() {
        // 4111 1111 1111 1111 is the classic Luhn-valid test number; changing the last digit breaks it.
        let (text, events) = redact_text("card 4111 1111 1111 1111 and 4111-1111-1111-1112.");
        assert!(text.starts_with("card <CREDIT_CARD> and "), "{text}");
        assert!(!text.contains("4111 1111 1111 1111"));
        assert!(events.contains(&(Event::CreditCardRedacted, 1)));
        assert!(luhn_valid("79927398713"));
        assert!(!luhn_valid("4111111111111112"));
    }

    #[test]
    fn phone_numbers_need_ten_digits_and_separators() {
        let (text, _) = redact_text("call +1 415-555-0132 or (212) 555-0199 today");
        assert_eq!(text, "call <PHONE_NUMBER> or <PHONE_NUMBER> today");
        let (text, _) = redact_text("in 1999 we sold 4155550132 units, room 12-34");
        assert_eq!(text, "in 1999 we sold 4155550132 units, room 12-34");
    }
}
