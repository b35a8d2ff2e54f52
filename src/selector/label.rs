//! Kubernetes label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k`, `!k`, and the numeric `k>n`, `k<n`, joined by
//! commas; whitespace is free.

use std::collections::BTreeSet;

use super::SelectorError;
use crate::object::LabelSet;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
    /// The label is set to an integer above this one.
    GreaterThan(i64),
    /// The label is set to an integer below this one.
    LessThan(i64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
}

impl LabelRequirement {
    /// What it costs to match, in terms: one, or each value of a set.
    pub fn terms(&self) -> usize {
        match &self.op {
            LabelOp::In(values) | LabelOp::NotIn(values) => values.len().max(1),
            _ => 1,
        }
    }

    /// As in Kubernetes: a missing label satisfies `!=` and `notin`; one
    /// that is not a 64-bit integer satisfies neither `>` nor `<`.
    pub fn matches(&self, labels: LabelSet<'_>) -> bool {
        let v = labels.get(&self.key);
        match &self.op {
            LabelOp::Equals(want) => v == Some(want.as_str()),
            LabelOp::NotEquals(want) => v != Some(want.as_str()),
            LabelOp::In(set) => v.is_some_and(|v| set.contains(v)),
            LabelOp::NotIn(set) => v.is_none_or(|v| !set.contains(v)),
            LabelOp::Exists => v.is_some(),
            LabelOp::DoesNotExist => v.is_none(),
            LabelOp::GreaterThan(n) => integer(v).is_some_and(|v| v > *n),
            LabelOp::LessThan(n) => integer(v).is_some_and(|v| v < *n),
        }
    }
}

/// A label's value read as Kubernetes reads it for `>` and `<`.
fn integer(v: Option<&str>) -> Option<i64> {
    v?.parse().ok()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Token<'a> {
    Word(&'a str),
    Comma,
    Open,
    Close,
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    Greater,
    Less,
}

/// A token and the byte offset it starts at.
type Spanned<'a> = (usize, Token<'a>);

fn lex(s: &str) -> Result<Vec<Spanned<'_>>, SelectorError> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let ch = s[i..].chars().next().expect("i is on a char boundary");
        let (len, tok) = match c {
            _ if ch.is_whitespace() => {
                i += ch.len_utf8();
                continue;
            }
            b',' => (1, Token::Comma),
            b'(' => (1, Token::Open),
            b')' => (1, Token::Close),
            b'=' if bytes.get(i + 1) == Some(&b'=') => (2, Token::DoubleEquals),
            b'=' => (1, Token::Equals),
            b'!' if bytes.get(i + 1) == Some(&b'=') => (2, Token::NotEquals),
            b'!' => (1, Token::Bang),
            b'>' => (1, Token::Greater),
            b'<' => (1, Token::Less),
            _ => {
                let end = s[i..]
                    .find(|c: char| c.is_whitespace() || ",()=!<>".contains(c))
                    .map_or(s.len(), |n| i + n);
                (end - i, Token::Word(&s[i..end]))
            }
        };
        out.push((i, tok));
        i += len;
    }
    Ok(out)
}

struct Parser<'a> {
    src: &'a str,
    tokens: Vec<Spanned<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, at: usize, why: impl std::fmt::Display) -> SelectorError {
        let near: String = self.src[at.min(self.src.len())..]
            .chars()
            .take(20)
            .collect();
        SelectorError::Label(format!("at position {at} ({near:?}): {why}"))
    }

    fn here(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.src.len(), |t| t.0)
    }

    fn peek(&self) -> Option<&Token<'a>> {
        self.tokens.get(self.pos).map(|t| &t.1)
    }

    fn next(&mut self) -> Option<Spanned<'a>> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn word(&mut self, what: &str) -> Result<(usize, &'a str), SelectorError> {
        match self.next() {
            Some((at, Token::Word(w))) => Ok((at, w)),
            Some((at, t)) => Err(self.err(at, format!("expected {what}, found {t:?}"))),
            None => Err(self.err(self.src.len(), format!("expected {what}, found the end"))),
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        let (at, k) = self.word("a label key")?;
        check_key(k).map_err(|why| self.err(at, why))?;
        Ok(k.to_owned())
    }

    fn value(&mut self) -> Result<String, SelectorError> {
        // An empty value is allowed: `k=` means "k is set to the empty string".
        match self.peek() {
            None | Some(Token::Comma) | Some(Token::Close) => return Ok(String::new()),
            _ => {}
        }
        let (at, v) = self.word("a label value")?;
        check_value(v).map_err(|why| self.err(at, why))?;
        Ok(v.to_owned())
    }

    /// The operand of `>` or `<`: a 64-bit integer, as Kubernetes requires.
    fn number(&mut self) -> Result<i64, SelectorError> {
        let (at, v) = self.word("an integer")?;
        v.parse()
            .map_err(|_| self.err(at, format!("{v:?} is not a 64-bit integer")))
    }

    fn set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        match self.next() {
            Some((_, Token::Open)) => {}
            other => {
                let at = other.map_or(self.src.len(), |t| t.0);
                return Err(self.err(at, "expected '(' to open the set of values"));
            }
        }
        let mut set = BTreeSet::new();
        loop {
            let at = self.here();
            let v = self.value()?;
            if v.is_empty() && matches!(self.peek(), Some(Token::Close)) && set.is_empty() {
                return Err(self.err(at, "the set of values must not be empty"));
            }
            set.insert(v);
            match self.next() {
                Some((_, Token::Comma)) => continue,
                Some((_, Token::Close)) => return Ok(set),
                other => {
                    let at = other.map_or(self.src.len(), |t| t.0);
                    return Err(self.err(at, "expected ',' or ')' in the set of values"));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        if let Some(Token::Bang) = self.peek() {
            self.pos += 1;
            let key = self.key()?;
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
            });
        }
        let key = self.key()?;
        let op = match self.peek() {
            None | Some(Token::Comma) => LabelOp::Exists,
            Some(Token::Equals) | Some(Token::DoubleEquals) => {
                self.pos += 1;
                LabelOp::Equals(self.value()?)
            }
            Some(Token::NotEquals) => {
                self.pos += 1;
                LabelOp::NotEquals(self.value()?)
            }
            Some(Token::Word("in")) => {
                self.pos += 1;
                LabelOp::In(self.set()?)
            }
            Some(Token::Word("notin")) => {
                self.pos += 1;
                LabelOp::NotIn(self.set()?)
            }
            Some(Token::Greater) => {
                self.pos += 1;
                LabelOp::GreaterThan(self.number()?)
            }
            Some(Token::Less) => {
                self.pos += 1;
                LabelOp::LessThan(self.number()?)
            }
            Some(t) => {
                let why = format!(
                    "expected an operator (=, ==, !=, in, notin, >, <) after key {key:?}, found {t:?}"
                );
                return Err(self.err(self.here(), why));
            }
        };
        Ok(LabelRequirement { key, op })
    }
}

/// Parses a label selector; the empty selector selects everything.
pub fn parse(selector: &str) -> Result<Vec<LabelRequirement>, SelectorError> {
    let tokens = lex(selector)?;
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let mut p = Parser {
        src: selector,
        tokens,
        pos: 0,
    };
    let mut out = Vec::new();
    loop {
        out.push(p.requirement()?);
        match p.next() {
            None => return Ok(out),
            Some((_, Token::Comma)) if p.peek().is_some() => continue,
            Some((at, Token::Comma)) => return Err(p.err(at, "trailing comma")),
            Some((at, t)) => {
                return Err(p.err(
                    at,
                    format!("expected ',' between requirements, found {t:?}"),
                ))
            }
        }
    }
}

/// A Kubernetes qualified name: an optional DNS-subdomain prefix and '/',
/// then a name.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() || p.len() > 253 || !p.split('.').all(label_ok) {
            return Err(format!(
                "key prefix {p:?} must be a lowercase DNS subdomain"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?} has an empty name"));
    }
    check_name(name).map_err(|why| format!("key name {name:?} {why}"))
}

fn check_value(value: &str) -> Result<(), String> {
    check_name(value).map_err(|why| format!("value {value:?} {why}"))
}

fn check_name(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    let inner_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err("must use only alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Meta;
    use proptest::prelude::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn req(key: &str, op: LabelOp) -> LabelRequirement {
        LabelRequirement {
            key: key.into(),
            op,
        }
    }

    #[test]
    fn every_operator_parses() {
        let cases: Vec<(&str, Vec<LabelRequirement>)> = vec![
            ("", vec![]),
            ("   ", vec![]),
            ("a=b", vec![req("a", LabelOp::Equals("b".into()))]),
            ("a==b", vec![req("a", LabelOp::Equals("b".into()))]),
            ("a!=b", vec![req("a", LabelOp::NotEquals("b".into()))]),
            ("a=", vec![req("a", LabelOp::Equals("".into()))]),
            (
                "a in (x, y ,z)",
                vec![req("a", LabelOp::In(set(&["x", "y", "z"])))],
            ),
            ("a notin (x)", vec![req("a", LabelOp::NotIn(set(&["x"])))]),
            ("a", vec![req("a", LabelOp::Exists)]),
            ("!a", vec![req("a", LabelOp::DoesNotExist)]),
            ("! a", vec![req("a", LabelOp::DoesNotExist)]),
            (
                " env in (prod,staging) , tier!=db,!canary,example.com/team=a-b_c.d ",
                vec![
                    req("env", LabelOp::In(set(&["prod", "staging"]))),
                    req("tier", LabelOp::NotEquals("db".into())),
                    req("canary", LabelOp::DoesNotExist),
                    req("example.com/team", LabelOp::Equals("a-b_c.d".into())),
                ],
            ),
            ("in in (in)", vec![req("in", LabelOp::In(set(&["in"])))]),
            ("a>5", vec![req("a", LabelOp::GreaterThan(5))]),
            (" a < -3 ", vec![req("a", LabelOp::LessThan(-3))]),
            (
                "x>0,x<10,y",
                vec![
                    req("x", LabelOp::GreaterThan(0)),
                    req("x", LabelOp::LessThan(10)),
                    req("y", LabelOp::Exists),
                ],
            ),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s).unwrap(), want, "{s:?}");
        }
    }

    #[test]
    fn every_error_class_points_at_the_bad_part() {
        let long = "x".repeat(64);
        let cases: Vec<(String, &str)> = vec![
            ("a=b,".into(), "trailing comma"),
            ("a=b,,c".into(), "expected a label key"),
            (",a".into(), "expected a label key"),
            ("a b".into(), "expected an operator"),
            ("a=b c=d".into(), "expected ','"),
            ("a in x".into(), "expected '('"),
            ("a in (x".into(), "expected ',' or ')'"),
            ("a in ()".into(), "must not be empty"),
            ("a notin (x y)".into(), "expected ',' or ')'"),
            ("-a=b".into(), "key name \"-a\""),
            ("a=-b".into(), "value \"-b\""),
            ("a=b!c".into(), "expected ','"),
            (format!("a={long}"), "at most 63"),
            (format!("{long}=a"), "at most 63"),
            ("Example.com/a=b".into(), "DNS subdomain"),
            ("/a=b".into(), "DNS subdomain"),
            ("a/=b".into(), "empty name"),
            ("!".into(), "expected a label key"),
            ("a==".into(), ""),
            ("(a)".into(), "expected a label key"),
            ("a>".into(), "expected an integer"),
            ("a>b".into(), "not a 64-bit integer"),
            ("a<1.5".into(), "not a 64-bit integer"),
            ("a>99999999999999999999".into(), "not a 64-bit integer"),
            ("a>=1".into(), "expected an integer"),
            (">1".into(), "expected a label key"),
        ];
        for (s, needle) in cases {
            match parse(&s) {
                Err(e) => assert!(e.to_string().contains(needle), "{s:?}: {e}"),
                Ok(r) if s == "a==" => assert_eq!(r, vec![req("a", LabelOp::Equals("".into()))]),
                Ok(r) => panic!("{s:?} parsed as {r:?}"),
            }
        }
        let e = parse("app=web,tier in (a").unwrap_err().to_string();
        assert!(e.contains("position 18"), "{e}");
    }

    #[test]
    fn missing_labels_satisfy_negative_operators() {
        let meta = Meta::from([("a", "1")]);
        let m = |s: &str| parse(s).unwrap().iter().all(|r| r.matches(meta.labels()));
        assert!(m("a=1") && m("a in (1,2)") && m("a") && m("b!=1") && m("b notin (1)") && m("!b"));
        assert!(!m("a!=1") && !m("a notin (1)") && !m("b in (1)") && !m("!a") && !m("b"));
    }

    #[test]
    fn numeric_operators_compare_integers_and_nothing_else() {
        let meta = Meta::from([("n", "7"), ("neg", "-2"), ("word", "seven"), ("big", "1e3")]);
        let m = |s: &str| parse(s).unwrap().iter().all(|r| r.matches(meta.labels()));
        assert!(m("n>6") && m("n<8") && m("n>-1") && m("neg<0") && m("neg>-3"));
        assert!(!m("n>7") && !m("n<7") && !m("neg>0"));
        // Missing, or not an integer: neither above nor below anything.
        for s in [
            "missing>0",
            "missing<0",
            "word>0",
            "word<0",
            "big>0",
            "big<0",
        ] {
            assert!(!m(s), "{s}");
        }
    }

    proptest! {
        #[test]
        fn the_parser_never_panics_on_selector_like_input(s in "[a-z0-9!=(), .in/<>-]{0,30}") {
            let _ = parse(&s);
        }
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_label_selectors(s in crate::fuzzing::text("label_selector")) {
            if let Ok(requirements) = parse(&s) {
                // What parses is a selector that evaluates.
                requirements.iter().for_each(|r| { r.matches(Meta::default().labels()); });
            }
        }
    }
}
