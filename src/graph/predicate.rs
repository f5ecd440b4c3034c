//! Predicates: static checks, evaluation, and a compact text form.
//!
//! This is the specification the Python runtime follows; `tests/vectors/predicates.json` holds
//! cases both implementations must answer identically. Evaluation is total: a path that does
//! not resolve or a value of the wrong type makes a comparison false, and nothing ever fails.
//!
//! - EXISTS: the path resolves (null included).
//! - EQ / NE: the path resolves and the value is (not) deep-equal to the literal. Numbers
//!   compare by exact mathematical value (1 == 1.0, 2^53 + 1 != 2^53 as a float); booleans are
//!   not numbers; object member order is irrelevant.
//! - LT / LE / GT / GE: both numbers (exact) or both strings (by Unicode code point); else false.
//! - IN: the value is deep-equal to some element of the literal array.
//! - CONTAINS: a string contains the literal string, or an array has an element equal to it.
//! - PREFIX: a string starts with the literal string.
//! - GLOB: a string matches the literal pattern as a whole; `*` = any run of code points
//!   (possibly empty), `?` = exactly one code point, all else literal (no escapes).
//! - TRUTHY: resolves and is not null, false, 0, "", [] or {}.
//! - all_of / any_of / negate: and / or / not. some / every: the path holds an array and some /
//!   every element satisfies the inner predicate, whose paths are relative to the element.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

use super::pointer;
use super::proto::{Compare, Op, Predicate, Quantified, predicate::P};

/// Most predicate nodes (compare, combinators, quantifiers) in one predicate.
pub const MAX_PREDICATE_NODES: usize = 64;
/// Deepest nesting of one predicate.
pub const MAX_PREDICATE_DEPTH: usize = 8;

/// Evaluates a predicate against a scope: `{<ingress>: request, <node>: output, ...}`.
pub fn evaluate(predicate: &Predicate, scope: &Value) -> bool {
    match &predicate.p {
        None => false,
        Some(P::Compare(compare)) => evaluate_compare(compare, scope),
        Some(P::AllOf(list)) => list.items.iter().all(|p| evaluate(p, scope)),
        Some(P::AnyOf(list)) => list.items.iter().any(|p| evaluate(p, scope)),
        Some(P::Negate(inner)) => !evaluate(inner, scope),
        Some(P::Some(q)) => quantify(q, scope, |items, inner| {
            items.iter().any(|e| evaluate(inner, e))
        }),
        Some(P::Every(q)) => quantify(q, scope, |items, inner| {
            items.iter().all(|e| evaluate(inner, e))
        }),
    }
}

fn quantify(q: &Quantified, scope: &Value, test: impl Fn(&[Value], &Predicate) -> bool) -> bool {
    match (pointer::resolve(scope, &q.path), q.inner.as_ref()) {
        (Some(Value::Array(items)), Some(inner)) => test(items, inner),
        _ => false,
    }
}

fn evaluate_compare(compare: &Compare, scope: &Value) -> bool {
    let Some(actual) = pointer::resolve(scope, &compare.path) else {
        return false;
    };
    let literal = compare.value.as_ref().map(|v| v.to_json());
    let Ok(op) = Op::try_from(compare.op) else {
        return false;
    };
    match (op, literal.as_ref()) {
        (Op::Exists, _) => true,
        (Op::Truthy, _) => truthy(actual),
        (_, None) | (Op::Unspecified, _) => false,
        (Op::Eq, Some(lit)) => json_eq(actual, lit),
        (Op::Ne, Some(lit)) => !json_eq(actual, lit),
        (Op::Lt, Some(lit)) => order(actual, lit) == Some(Ordering::Less),
        (Op::Le, Some(lit)) => matches!(order(actual, lit), Some(Ordering::Less | Ordering::Equal)),
        (Op::Gt, Some(lit)) => order(actual, lit) == Some(Ordering::Greater),
        (Op::Ge, Some(lit)) => {
            matches!(
                order(actual, lit),
                Some(Ordering::Greater | Ordering::Equal)
            )
        }
        (Op::In, Some(Value::Array(options))) => options.iter().any(|o| json_eq(actual, o)),
        (Op::In, Some(_)) => false,
        (Op::Contains, Some(lit)) => match (actual, lit) {
            (Value::String(s), Value::String(needle)) => s.contains(needle.as_str()),
            (Value::Array(items), _) => items.iter().any(|item| json_eq(item, lit)),
            _ => false,
        },
        (Op::Prefix, Some(lit)) => match (actual, lit) {
            (Value::String(s), Value::String(prefix)) => s.starts_with(prefix.as_str()),
            _ => false,
        },
        (Op::Glob, Some(lit)) => match (actual, lit) {
            (Value::String(s), Value::String(pattern)) => glob_match(pattern, s),
            _ => false,
        },
    }
}

/// Python-style truthiness over JSON.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => number(n).is_some_and(|n| !n.is_zero()),
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
    }
}

/// Deep JSON equality with numbers compared by exact value.
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Number(_), Value::Number(_)) => order(a, b) == Some(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => false,
    }
}

/// Order of two numbers or two strings; `None` for anything else.
fn order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number(x)?.cmp_exact(number(y)?),
        (Value::String(x), Value::String(y)) => Some(x.as_str().cmp(y.as_str())),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

fn number(n: &serde_json::Number) -> Option<Num> {
    if let Some(i) = n.as_i64() {
        Some(Num::Int(i.into()))
    } else if let Some(u) = n.as_u64() {
        Some(Num::Int(u.into()))
    } else {
        n.as_f64().map(Num::Float)
    }
}

impl Num {
    fn is_zero(self) -> bool {
        match self {
            Num::Int(i) => i == 0,
            Num::Float(f) => f == 0.0,
        }
    }

    /// Exact comparison, as Python compares int and float (no rounding of big integers).
    fn cmp_exact(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (Num::Float(a), Num::Float(b)) => a.partial_cmp(&b),
            (Num::Int(a), Num::Float(b)) => int_vs_float(a, b),
            (Num::Float(a), Num::Int(b)) => int_vs_float(b, a).map(Ordering::reverse),
        }
    }
}

fn int_vs_float(i: i128, f: f64) -> Option<Ordering> {
    // |i| < 2^64 here; floats beyond ±2^100 are decided by their sign alone.
    const BIG: f64 = 1.2676506002282294e30; // 2^100
    if f.is_nan() {
        return None;
    }
    if f >= BIG {
        return Some(Ordering::Less);
    }
    if f <= -BIG {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    // Exact: |whole| < 2^100 fits i128 and a float that large is already an integer.
    match i.cmp(&(whole as i128)) {
        Ordering::Equal => 0.0_f64.partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

/// Whole-string glob match over code points: `*` any run, `?` one code point. Linear-time
/// backtracking to the last star, so no pattern can blow up.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == t[ti])) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((star_p, star_t)) = star {
            pi = star_p + 1;
            ti = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

// ---------------------------------------------------------------------------------------------
// Static checks

/// A problem found in a predicate without evaluating it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where inside the predicate, e.g. `all_of[1].compare.value`.
    pub at: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// A path whose first segment must name the ingress or an ancestor (the edge's scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedPath<'a> {
    /// Where inside the predicate.
    pub at: String,
    /// The pointer.
    pub path: &'a str,
}

/// Checks syntax, literal types and size; returns every problem, and the top-level paths whose
/// scope the caller checks against the graph.
pub fn check(predicate: &Predicate) -> (Vec<Problem>, Vec<ScopedPath<'_>>) {
    let mut checker = Checker {
        problems: Vec::new(),
        scoped: Vec::new(),
        nodes: 0,
        too_deep: false,
    };
    checker.visit(predicate, String::new(), 1, true);
    if checker.nodes > MAX_PREDICATE_NODES {
        checker.problems.push(Problem {
            at: String::new(),
            message: format!(
                "has {} predicate nodes, more than the limit of {MAX_PREDICATE_NODES}; move the logic into a model node",
                checker.nodes
            ),
        });
    }
    (checker.problems, checker.scoped)
}

struct Checker<'a> {
    problems: Vec<Problem>,
    scoped: Vec<ScopedPath<'a>>,
    nodes: usize,
    too_deep: bool,
}

fn join_at(prefix: &str, part: &str) -> String {
    if prefix.is_empty() {
        part.to_string()
    } else {
        format!("{prefix}.{part}")
    }
}

impl<'a> Checker<'a> {
    fn problem(&mut self, at: String, message: impl Into<String>) {
        self.problems.push(Problem {
            at,
            message: message.into(),
        });
    }

    fn visit(&mut self, predicate: &'a Predicate, at: String, depth: usize, top_level: bool) {
        self.nodes += 1;
        if self.nodes > MAX_PREDICATE_NODES {
            return;
        }
        if depth > MAX_PREDICATE_DEPTH {
            if !self.too_deep {
                self.too_deep = true;
                self.problem(
                    at,
                    format!("nests deeper than {MAX_PREDICATE_DEPTH} levels"),
                );
            }
            return;
        }
        match &predicate.p {
            None => self.problem(
                at,
                "is empty: set one of compare, all_of, any_of, negate, some, every",
            ),
            Some(P::Compare(compare)) => self.compare(compare, join_at(&at, "compare"), top_level),
            Some(P::AllOf(list)) | Some(P::AnyOf(list)) => {
                let name = if matches!(predicate.p, Some(P::AllOf(_))) {
                    "all_of"
                } else {
                    "any_of"
                };
                let at = join_at(&at, name);
                if list.items.is_empty() {
                    self.problem(at.clone(), "is an empty list; give at least one predicate");
                }
                for (i, item) in list.items.iter().enumerate() {
                    self.visit(item, format!("{at}[{i}]"), depth + 1, top_level);
                }
            }
            Some(P::Negate(inner)) => {
                self.visit(inner, join_at(&at, "negate"), depth + 1, top_level)
            }
            Some(P::Some(q)) | Some(P::Every(q)) => {
                let name = if matches!(predicate.p, Some(P::Some(_))) {
                    "some"
                } else {
                    "every"
                };
                let at = join_at(&at, name);
                self.path(&q.path, format!("{at}.path"), top_level);
                match &q.inner {
                    Some(inner) => self.visit(inner, format!("{at}.inner"), depth + 1, false),
                    None => self.problem(at, "has no inner predicate"),
                }
            }
        }
    }

    fn path(&mut self, path: &'a str, at: String, top_level: bool) {
        if let Err(e) = pointer::check(path) {
            self.problem(at, format!("path {path:?} is not a JSON Pointer: {e}"));
        } else if top_level {
            if path.is_empty() {
                self.problem(
                    at,
                    "path is empty; start it with the ingress or a node name, e.g. \"/request/field\"",
                );
            } else {
                self.scoped.push(ScopedPath { at, path });
            }
        }
    }

    fn compare(&mut self, compare: &'a Compare, at: String, top_level: bool) {
        self.path(&compare.path, format!("{at}.path"), top_level);
        let value = compare.value.as_ref().map(|v| v.to_json());
        let value_at = format!("{at}.value");
        if let Some(v) = &compare.value
            && !super::validate::json_value_is_finite(v)
        {
            self.problem(value_at.clone(), "contains a number that is not finite");
        }
        let op = match Op::try_from(compare.op) {
            Ok(Op::Unspecified) => {
                self.problem(format!("{at}.op"), "is not set; choose EXISTS, EQ, NE, LT, LE, GT, GE, IN, CONTAINS, PREFIX, GLOB or TRUTHY");
                return;
            }
            Ok(op) => op,
            Err(_) => {
                self.problem(
                    format!("{at}.op"),
                    format!("{} is not a known operator", compare.op),
                );
                return;
            }
        };
        let name = op_symbol(op);
        match (op, &value) {
            (Op::Exists | Op::Truthy, Some(_)) => {
                self.problem(value_at, format!("{name} takes no value; remove it"))
            }
            (Op::Exists | Op::Truthy, None) => {}
            (_, None) => self.problem(value_at, format!("{name} needs a value")),
            (Op::Eq | Op::Ne | Op::Contains, Some(_)) => {}
            (Op::Lt | Op::Le | Op::Gt | Op::Ge, Some(Value::Number(_) | Value::String(_))) => {}
            (Op::Lt | Op::Le | Op::Gt | Op::Ge, Some(other)) => self.problem(
                value_at,
                format!(
                    "{name} compares numbers or strings, not {}",
                    type_name(other)
                ),
            ),
            (Op::In, Some(Value::Array(_))) => {}
            (Op::In, Some(other)) => self.problem(
                value_at,
                format!("in needs an array of options, not {}", type_name(other)),
            ),
            (Op::Prefix | Op::Glob, Some(Value::String(_))) => {}
            (Op::Prefix | Op::Glob, Some(other)) => self.problem(
                value_at,
                format!("{name} needs a string, not {}", type_name(other)),
            ),
            (Op::Unspecified, _) => {}
        }
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn op_symbol(op: Op) -> &'static str {
    match op {
        Op::Unspecified => "?",
        Op::Exists => "exists",
        Op::Eq => "==",
        Op::Ne => "!=",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Gt => ">",
        Op::Ge => ">=",
        Op::In => "in",
        Op::Contains => "contains",
        Op::Prefix => "prefix",
        Op::Glob => "glob",
        Op::Truthy => "truthy",
    }
}

// ---------------------------------------------------------------------------------------------
// Text form

/// A compact, human-readable form of a predicate (for DOT labels and messages), e.g.
/// `(/request/tier == "gold" && !(exists /request/trial))`.
pub struct Text<'a>(pub &'a Predicate);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.p {
            None => f.write_str("<empty>"),
            Some(P::Compare(c)) => {
                let op = Op::try_from(c.op).unwrap_or(Op::Unspecified);
                match (op, &c.value) {
                    (Op::Exists | Op::Truthy, _) | (_, None) => {
                        write!(f, "{} {}", op_symbol(op), display_path(&c.path))
                    }
                    (_, Some(v)) => write!(
                        f,
                        "{} {} {}",
                        display_path(&c.path),
                        op_symbol(op),
                        v.to_json()
                    ),
                }
            }
            Some(P::AllOf(list)) => write_list(f, &list.items, " && "),
            Some(P::AnyOf(list)) => write_list(f, &list.items, " || "),
            Some(P::Negate(inner)) => write!(f, "!({})", Text(inner)),
            Some(P::Some(q)) | Some(P::Every(q)) => {
                let word = if matches!(self.0.p, Some(P::Some(_))) {
                    "some"
                } else {
                    "every"
                };
                match &q.inner {
                    Some(inner) => write!(f, "{word} {} ({})", display_path(&q.path), Text(inner)),
                    None => write!(f, "{word} {} (<empty>)", display_path(&q.path)),
                }
            }
        }
    }
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "." } else { path }
}

fn write_list(f: &mut fmt::Formatter<'_>, items: &[Predicate], separator: &str) -> fmt::Result {
    f.write_str("(")?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(separator)?;
        }
        write!(f, "{}", Text(item))?;
    }
    f.write_str(")")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::proto::{JsonValue, PredicateList};
    use serde_json::json;

    fn cmp(path: &str, op: Op, value: Option<JsonValue>) -> Predicate {
        Predicate {
            p: Some(P::Compare(Compare {
                path: path.into(),
                op: op as i32,
                value,
            })),
        }
    }

    #[test]
    fn glob_handles_stars_and_code_points() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a?c", "aéc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*.jpg", "x.y.jpg"));
        assert!(!glob_match("*.jpg", "x.jpeg"));
        assert!(glob_match("**a**", "bab"));
        // A pattern that is exponential for naive backtracking stays fast.
        let text = "a".repeat(5000);
        assert!(!glob_match(&format!("{}b", "*a".repeat(50)), &text));
    }

    #[test]
    fn numbers_compare_exactly() {
        let big = json!(9007199254740993_i64);
        let big_float = json!(9007199254740992.0_f64);
        assert!(!json_eq(&big, &big_float));
        assert!(json_eq(&json!(1), &json!(1.0)));
        assert!(!json_eq(&json!(1), &json!(true)));
        assert_eq!(order(&json!(2), &json!(2.5)), Some(Ordering::Less));
        assert_eq!(order(&json!(-3), &json!(-3.5)), Some(Ordering::Greater));
        assert_eq!(order(&json!(u64::MAX), &json!(1e300)), Some(Ordering::Less));
        assert_eq!(order(&json!("b"), &json!("a")), Some(Ordering::Greater));
        assert_eq!(order(&json!("1"), &json!(1)), None);
    }

    #[test]
    fn checks_literal_types_and_limits() {
        let bad = cmp("/request/x", Op::Gt, Some(JsonValue::boolean(true)));
        let (problems, _) = check(&bad);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].at, "compare.value");

        let mut deep = cmp("/request/x", Op::Exists, None);
        for _ in 0..10 {
            deep = Predicate {
                p: Some(P::Negate(Box::new(deep))),
            };
        }
        let (problems, _) = check(&deep);
        assert!(
            problems.iter().any(|p| p.message.contains("deeper")),
            "{problems:?}"
        );

        let wide = Predicate {
            p: Some(P::AnyOf(PredicateList {
                items: (0..70)
                    .map(|_| cmp("/request/x", Op::Exists, None))
                    .collect(),
            })),
        };
        let (problems, _) = check(&wide);
        assert!(
            problems.iter().any(|p| p.message.contains("limit")),
            "{problems:?}"
        );
    }

    #[test]
    fn scoped_paths_exclude_quantifier_insides() {
        let p = Predicate {
            p: Some(P::Some(Box::new(Quantified {
                path: "/model/items".into(),
                inner: Some(Box::new(cmp("/score", Op::Gt, Some(JsonValue::int(3))))),
            }))),
        };
        let (problems, scoped) = check(&p);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            scoped.iter().map(|s| s.path).collect::<Vec<_>>(),
            vec!["/model/items"]
        );
        assert_eq!(Text(&p).to_string(), "some /model/items (/score > 3)");
    }
}
