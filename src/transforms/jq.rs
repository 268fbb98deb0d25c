//! jq programs over records, with [jaq](https://github.com/01mf02/jaq), a jq
//! implementation in Rust: `[[transform]] type = "jq"` and the `condition` of
//! `filter`.
//!
//! A program's work per record is bounded: the builtins that iterate without bound
//! (`range`, `repeat`, `recurse`, `while`, `until`, and all that are made of them)
//! spend one unit of a per-record budget per step, outputs are counted, and a
//! definition that calls itself is refused at load (jaq would loop on it without
//! passing through a metered builtin). A record that exceeds the budget gets an error,
//! which follows the transform's `on_error` like any other.

use super::{Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use crate::dead_letter::OnError;
use jaq_core::load::parse::{BinaryOp, Def, Pattern, Term};
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, native, Compiler, Ctx, Error, Exn, Vars};
use jaq_json::Val;
use serde::Deserialize;
use serde_json::Value;
use std::cell::Cell;
use std::ops::ControlFlow;
use std::sync::Arc;

type Data = data::JustLut<Val>;

thread_local! {
    /// What is left of the running program's budget, on this thread.
    static FUEL: Cell<u64> = const { Cell::new(0) };
    /// The running program spent its budget (a `try` may have caught the error: the
    /// record fails all the same).
    static EXHAUSTED: Cell<bool> = const { Cell::new(false) };
}

/// The native `_tick`: passes its input on, or fails once the budget is spent.
fn tick(cv: jaq_core::Cv<'_, Data>) -> jaq_core::ValXs<'_, Val> {
    let left = FUEL.with(|f| {
        let left = f.get();
        f.set(left.saturating_sub(1));
        left
    });
    Box::new(std::iter::once(if left == 0 {
        EXHAUSTED.with(|e| e.set(true));
        Err(Exn::from(Error::str(WORK_LIMIT)))
    } else {
        Ok(cv.1)
    }))
}

/// The builtins a job's program cannot call: they would stop the process (`halt`,
/// `halt_error`), read its environment or other inputs (`env`, `input`, `inputs`), or
/// give another result on a replay or another machine (`now`, `localtime`,
/// `strflocaltime`), which breaks exactly-once.
const REFUSED: &[&str] = &[
    "halt",
    "env",
    "input",
    "inputs",
    "now",
    "localtime",
    "strflocaltime",
];

/// What a refused builtin does.
fn refused(_: jaq_core::Cv<'_, Data>) -> jaq_core::ValXs<'_, Val> {
    Box::new(std::iter::once(Err(Exn::from(Error::str(
        "this builtin is not available to a job (halt, env, input, now, localtime: they stop the process, read outside the record, or differ on a replay)",
    )))))
}

const WORK_LIMIT: &str = "the work limit (work_limit) is exhausted";

/// The builtins that iterate without bound, each step through `_tick`; they replace
/// jaq's own definitions (`range/3` is jaq's native, renamed `_range`).
const METERED: &str = r#"
def range($from; $upto; $by): _range($from; $upto; $by) | _tick;
def repeat(f): def rec: _tick | ., (f | rec); rec;
def recurse(f): def rec: _tick | ., (f | rec); rec;
def while(cond; update): def rec: _tick | if cond then ., (update | rec) else empty end; rec;
def until(cond; update): def rec: _tick | if cond then . else update | rec end; rec;
"#;

/// How much a program may do for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Steps of the iterating builtins.
    pub work: u64,
    /// Outputs.
    pub outputs: usize,
}

/// A compiled jq program. `.` is the record's value, `$meta` its metadata (see
/// [`meta_value`]).
pub struct Program {
    filter: jaq_core::Filter<Data>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Program")
    }
}

/// Line and column (from 1) of byte `at` of `code`.
fn position(code: &str, at: usize) -> (usize, usize) {
    let before = &code[..at.min(code.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Where `part` (a slice of `code`) starts in it, if it is one.
fn offset_in(code: &str, part: &str) -> Option<usize> {
    let (c, p) = (code.as_ptr() as usize, part.as_ptr() as usize);
    (p >= c && p + part.len() <= c + code.len()).then(|| p - c)
}

fn at(code: &str, part: &str) -> String {
    match offset_in(code, part) {
        Some(o) => {
            let (line, column) = position(code, o);
            format!("line {line}, column {column}")
        }
        None => "the end".into(),
    }
}

impl Program {
    /// Compiles `code`, or says what is wrong and where (line and column).
    pub fn compile(code: &str) -> Result<Program, String> {
        let metered =
            jaq_core::load::parse(METERED, |p| p.defs()).expect("the metered builtins parse");
        let mut defs = Vec::new();
        let mut range = Some(metered[0].clone());
        for d in jaq_core::defs() {
            // jaq's own definitions of range/1 and range/2 call range/3: ours first.
            if d.name == "range" {
                defs.extend(range.take());
            }
            let ours = metered
                .iter()
                .find(|m| m.name == d.name && m.args.len() == d.args.len());
            defs.push(ours.cloned().unwrap_or(d));
        }
        let defs = defs
            .into_iter()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs::<Data>()
            .map(|f| {
                if f.0 == "range" {
                    ("_range", f.1, f.2)
                } else {
                    f
                }
            })
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .map(|f| {
                if REFUSED.contains(&f.0) {
                    native::run::<Data>((f.0, f.1, refused))
                } else {
                    f
                }
            })
            .chain([native::run::<Data>(("_tick", native::v(0), tick))]);
        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(&arena, File { code, path: () })
            .map_err(|errors| {
                let mut why = Vec::new();
                for (_, e) in errors {
                    match e {
                        jaq_core::load::Error::Lex(es) => {
                            why.extend(es.iter().map(|(expect, part)| {
                                format!("expected {} at {}", expect.as_str(), at(code, part))
                            }))
                        }
                        jaq_core::load::Error::Parse(es) => {
                            why.extend(es.iter().map(|(expect, part)| {
                                let found = part.chars().take(20).collect::<String>();
                                if found.is_empty() {
                                    format!("expected {} at {}", expect.as_str(), at(code, part))
                                } else {
                                    format!(
                                        "expected {} at {}, found `{found}`",
                                        expect.as_str(),
                                        at(code, part)
                                    )
                                }
                            }))
                        }
                        jaq_core::load::Error::Io(es) => {
                            why.extend(es.into_iter().map(|(path, e)| format!("{path}: {e}")))
                        }
                    }
                }
                why.join("; ")
            })?;
        // What loaded but is not one term (a module header, an import) would pass
        // the check below unseen: refused.
        let term = jaq_core::load::parse(code, |p| p.term()).ok_or_else(|| {
            "a job's program is definitions and a filter, without module headers or imports"
                .to_string()
        })?;
        if let Some(name) = recursive_def(&term) {
            return Err(format!(
                "definition `{name}` at {} calls itself, which the work limit cannot bound: use repeat, recurse, while or until",
                at(code, name)
            ));
        }
        let filter = Compiler::default()
            .with_funs(funs)
            .with_global_vars(["$meta"])
            .compile(modules)
            .map_err(|errors| {
                errors
                    .iter()
                    .flat_map(|(_, es)| es.iter())
                    .map(|(name, undefined)| {
                        let what = match undefined {
                            jaq_core::compile::Undefined::Var => "variable",
                            jaq_core::compile::Undefined::Filter(_) => "filter",
                            jaq_core::compile::Undefined::Label => "label",
                            jaq_core::compile::Undefined::Mod => "module",
                            _ => "name",
                        };
                        format!("undefined {what} `{name}` at {}", at(code, name))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
        Ok(Program { filter })
    }

    /// Runs the program on `input` with `$meta` = `meta`, passing each output to
    /// `out` until it says to stop (the rest are never computed); an error (the
    /// program's, or a limit's) ends the run.
    pub fn run(
        &self,
        input: &Value,
        meta: &Value,
        limits: Limits,
        mut out: impl FnMut(Value) -> ControlFlow<()>,
    ) -> Result<(), String> {
        let input = val(input).map_err(|e| format!("the value: {e}"))?;
        let meta = val(meta).map_err(|e| format!("$meta: {e}"))?;
        let mut text = Vec::new();
        self.run_val(input, meta, limits, |v| {
            text.clear();
            let v = json_text(&v, &mut text)
                .and_then(|()| serde_json::from_slice(&text).map_err(|e| (v, e.to_string())))
                .map_err(|(v, e)| format!("an output is not JSON ({v}): {e}"))?;
            Ok(out(v))
        })
    }

    /// [`Program::run`] on the JSON text `input`, each output as its JSON text (the
    /// input's numbers keep their digits through both, as they do through jq).
    pub fn run_text(
        &self,
        input: &[u8],
        meta: Val,
        limits: Limits,
        mut out: impl FnMut(Vec<u8>) -> ControlFlow<()>,
    ) -> Result<(), String> {
        let input = jaq_json::read::parse_single(input).map_err(|e| format!("the value: {e}"))?;
        self.run_val(input, meta, limits, |v| {
            let mut text = Vec::new();
            json_text(&v, &mut text)
                .map_err(|(v, e)| format!("an output is not JSON ({v}): {e}"))?;
            Ok(out(text))
        })
    }

    /// Runs the program on `input` with `$meta`, within `limits`, handing each output
    /// to `out` until it breaks; an error of the program, a limit passed, or one of
    /// `out` is the record's error.
    fn run_val(
        &self,
        input: Val,
        meta: Val,
        limits: Limits,
        mut out: impl FnMut(Val) -> Result<ControlFlow<()>, String>,
    ) -> Result<(), String> {
        FUEL.with(|f| f.set(limits.work));
        EXHAUSTED.with(|e| e.set(false));
        let exhausted = || EXHAUSTED.with(Cell::get);
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([meta]));
        let mut n = 0usize;
        for output in self.filter.id.run((ctx, input)) {
            // A halt cannot come (its builtins are refused); were one to, it is the
            // record's error, never the end of the process.
            let v = output.map_err(|e| match e.get_err() {
                Ok(e) => e.to_string(),
                Err(_) => "the program halted".to_string(),
            })?;
            if exhausted() {
                return Err(WORK_LIMIT.into());
            }
            n += 1;
            if n > limits.outputs {
                return Err(format!(
                    "more than {} outputs (max_outputs) for one record",
                    limits.outputs
                ));
            }
            if out(v)?.is_break() {
                break;
            }
        }
        if exhausted() {
            return Err(WORK_LIMIT.into());
        }
        Ok(())
    }
}

/// The JSON text of `v` into `out`, or `v` and why it has none (jaq's values include
/// what JSON cannot say: NaN and infinities, byte strings, text that is not UTF-8, keys
/// that are not strings). Numbers are written as jaq writes them (a decimal that came
/// in as text keeps it).
fn json_text(v: &Val, out: &mut Vec<u8>) -> Result<(), (Val, String)> {
    write_json(v, out).map_err(|e| (v.clone(), e))
}

/// Writes `v` as compact JSON text to `out`, or says why it is not JSON.
fn write_json(v: &Val, out: &mut Vec<u8>) -> Result<(), String> {
    use std::io::Write;
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(n) => {
            let at = out.len();
            write!(out, "{n}").expect("writing to a Vec");
            if !json_number(&out[at..]) {
                let text = String::from_utf8_lossy(&out[at..]).into_owned();
                return Err(format!("{text} is not a JSON number"));
            }
        }
        Val::TStr(b) => {
            let s = std::str::from_utf8(b).map_err(|e| format!("a string is not UTF-8: {e}"))?;
            serde_json::to_writer(&mut *out, s).expect("a string serializes");
        }
        Val::BStr(_) => return Err("a byte string has no JSON text".into()),
        Val::Arr(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(x, out)?;
            }
            out.push(b']');
        }
        Val::Obj(o) => {
            out.push(b'{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match k {
                    Val::TStr(_) => write_json(k, out)?,
                    _ => return Err("an object key is not a string".into()),
                }
                out.push(b':');
                write_json(x, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Whether `t` is a number by JSON's grammar: `-? int frac? exp?`.
pub(crate) fn json_number(t: &[u8]) -> bool {
    let digits = |i: &mut usize| {
        let start = *i;
        while t.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    let mut i = usize::from(t.first() == Some(&b'-'));
    match t.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if t.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if matches!(t.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(t.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == t.len()
}

/// `v` as jq sees it, through its text: a number keeps its digits (jq's own reader keeps
/// a decimal as written until arithmetic makes a new one, and integers of any size
/// exact), where a conversion through serde would round it through a double.
fn val(v: &Value) -> Result<Val, String> {
    let text = serde_json::to_vec(v).map_err(|e| e.to_string())?;
    jaq_json::read::parse_single(&text).map_err(|e| e.to_string())
}

/// The name of a definition in `term` that calls itself, if one does.
fn recursive_def<'s>(term: &Term<&'s str>) -> Option<&'s str> {
    let mut found = None;
    visit(term, &mut |t| {
        if let Term::Def(defs, _) = t {
            for d in defs {
                if found.is_none() && calls(&d.body, d) {
                    found = Some(d.name);
                }
            }
        }
    });
    found
}

/// Whether `body` calls `def` (same name and arity).
fn calls(body: &Term<&str>, def: &Def<&str>) -> bool {
    let mut yes = false;
    visit(body, &mut |t| {
        if let Term::Call(name, args) = t {
            yes |= *name == def.name && args.len() == def.args.len();
        }
    });
    yes
}

/// Calls `f` on `t` and each term inside it.
fn visit<'a, S>(t: &'a Term<S>, f: &mut impl FnMut(&'a Term<S>)) {
    use jaq_core::load::lex::StrPart;
    use jaq_core::path::Part;
    f(t);
    match t {
        Term::Id | Term::Recurse | Term::Num(_) | Term::Break(_) | Term::Var(_) => {}
        Term::Str(_, parts) => {
            for p in parts {
                if let StrPart::Term(t) = p {
                    visit(t, f)
                }
            }
        }
        Term::Arr(a) => {
            if let Some(a) = a {
                visit(a, f)
            }
        }
        Term::Obj(kvs) => {
            for (k, v) in kvs {
                visit(k, f);
                if let Some(v) = v {
                    visit(v, f)
                }
            }
        }
        Term::Neg(t) | Term::Label(_, t) => visit(t, f),
        Term::BinOp(l, op, r) => {
            visit(l, f);
            if let BinaryOp::Pipe(Some(p)) = op {
                visit_pattern(p, f);
            }
            visit(r, f);
        }
        Term::Fold(_, x, p, ts) => {
            visit(x, f);
            visit_pattern(p, f);
            ts.iter().for_each(|t| visit(t, f));
        }
        Term::TryCatch(t, c) => {
            visit(t, f);
            if let Some(c) = c {
                visit(c, f)
            }
        }
        Term::IfThenElse(branches, otherwise) => {
            for (c, t) in branches {
                visit(c, f);
                visit(t, f);
            }
            if let Some(o) = otherwise {
                visit(o, f)
            }
        }
        Term::Def(defs, rest) => {
            defs.iter().for_each(|d| visit(&d.body, f));
            visit(rest, f);
        }
        Term::Call(_, args) => args.iter().for_each(|a| visit(a, f)),
        Term::Path(t, path) => {
            visit(t, f);
            for (part, _) in path.0.iter() {
                match part {
                    Part::Index(i) => visit(i, f),
                    Part::Range(a, b) => {
                        if let Some(a) = a {
                            visit(a, f)
                        }
                        if let Some(b) = b {
                            visit(b, f)
                        }
                    }
                }
            }
        }
    }
}

fn visit_pattern<'a, S>(p: &'a Pattern<S>, f: &mut impl FnMut(&'a Term<S>)) {
    match p {
        Pattern::Var(_) => {}
        Pattern::Arr(ps) => ps.iter().for_each(|p| visit_pattern(p, f)),
        Pattern::Obj(kvs) => {
            for (k, p) in kvs {
                visit(k, f);
                visit_pattern(p, f);
            }
        }
    }
}

/// `$meta` of a record: `{key, topic, partition, offset, timestamp, headers}`, the key
/// as text (null without one), headers as an object of each name's last value as text.
pub fn meta_value(parts: &Parts, meta: &Meta) -> Value {
    let text = |b: &[u8]| Value::String(String::from_utf8_lossy(b).into_owned());
    let mut headers = serde_json::Map::new();
    for (name, value) in meta.headers.into_iter().flatten() {
        headers.insert(name.clone(), value.as_deref().map_or(Value::Null, text));
    }
    serde_json::json!({
        "key": parts.key.as_deref().map_or(Value::Null, text),
        "topic": meta.topic,
        "partition": meta.partition,
        "offset": meta.offset,
        "timestamp": meta.timestamp,
        "headers": headers,
    })
}

/// [`meta_value`] as jq's value, built directly (its fields in the same order).
fn meta_val(key: Option<&[u8]>, meta: &Meta) -> Val {
    let text = |b: &[u8]| Val::from(String::from_utf8_lossy(b).into_owned());
    let num = |n: Option<i64>| n.map_or(Val::Null, |n| Val::Num(jaq_json::Num::from_integral(n)));
    let name = |n: &str| Val::from(n.to_string());
    // A name that repeats keeps its last value, in the names' order (as `meta_value`).
    let headers: std::collections::BTreeMap<&str, Val> = meta
        .headers
        .into_iter()
        .flatten()
        .map(|(n, v)| (n.as_str(), v.as_deref().map_or(Val::Null, text)))
        .collect();
    let mut m = jaq_json::Map::default();
    m.insert(
        name("headers"),
        Val::obj(headers.into_iter().map(|(n, v)| (name(n), v)).collect()),
    );
    m.insert(name("key"), key.map_or(Val::Null, text));
    m.insert(name("offset"), num(meta.offset));
    m.insert(name("partition"), num(meta.partition.map(i64::from)));
    m.insert(name("timestamp"), num(meta.timestamp));
    m.insert(name("topic"), meta.topic.map_or(Val::Null, name));
    Val::obj(m)
}

/// `[[transform]] type = "jq"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JqConfig {
    /// The program (`filter = '...'`).
    pub filter: String,
    /// `fail` (default), `skip` or `dead-letter:<topic>`: what a record the program
    /// fails on (or exceeds a limit on) becomes.
    #[serde(default)]
    pub on_error: Option<String>,
    /// Steps of the iterating builtins a record may take (default 100000).
    #[serde(default = "default_work")]
    pub work_limit: u64,
    /// Outputs a record may have (default 1000).
    #[serde(default = "default_outputs")]
    pub max_outputs: usize,
}

fn default_work() -> u64 {
    100_000
}

fn default_outputs() -> usize {
    1000
}

/// The jq transform: each output of the program on a record's value is a record
/// with the input's key, operation, headers, timestamp and origin; no output drops
/// the record. Tombstones pass unchanged (they have no value).
#[derive(Debug)]
pub struct Jq {
    program: Program,
    /// The program's shape, when it only makes an object of top-level fields.
    shape: Option<super::jq_shape::Shape>,
    /// The program names `$meta` (else it gets `null`, which it cannot see, and the
    /// records' headers need not be read).
    meta: bool,
    limits: Limits,
    on_error: OnError,
}

impl Jq {
    /// The transform of `code` with the defaults' limits, failing the job on an error.
    pub fn new(code: &str) -> Result<Jq, String> {
        Ok(Jq {
            program: Program::compile(code)?,
            shape: super::jq_shape::Shape::of(code),
            meta: names_meta(code),
            limits: Limits {
                work: default_work(),
                outputs: default_outputs(),
            },
            on_error: OnError::Fail,
        })
    }
}

impl SmtConfig for JqConfig {
    const KIND: &'static str = "jq";

    fn build(self, cx: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        let program = Program::compile(&self.filter).map_err(|e| KeyError::new("filter", e))?;
        let on_error = super::on_error(self.on_error.as_deref(), cx)?;
        if self.work_limit == 0 {
            return Err(KeyError::new("work_limit", "must be at least 1"));
        }
        if self.max_outputs == 0 {
            return Err(KeyError::new("max_outputs", "must be at least 1"));
        }
        Ok(Arc::new(Jq {
            program,
            shape: super::jq_shape::Shape::of(&self.filter),
            meta: names_meta(&self.filter),
            limits: Limits {
                work: self.work_limit,
                outputs: self.max_outputs,
            },
            on_error,
        }))
    }
}

/// Whether `code` may name `$meta` (any mention of the word counts).
fn names_meta(code: &str) -> bool {
    code.contains("meta")
}

impl Smt for Jq {
    fn textual(&self) -> bool {
        true
    }

    fn top_level(&self) -> bool {
        self.shape.is_some()
    }

    fn apply_fields<'a>(
        &'a self,
        fields: &mut super::shallow::Fields<'a>,
        meta: &Meta,
    ) -> Option<Result<(), String>> {
        let shape = self.shape.as_ref()?;
        shape.apply(fields, meta).then_some(Ok(()))
    }

    fn expand_text(
        &self,
        text: &[u8],
        key: Option<&[u8]>,
        meta: &Meta,
        out: &mut dyn FnMut(Vec<u8>),
    ) -> Option<Result<(), String>> {
        let m = if self.meta {
            meta_val(key, meta)
        } else {
            Val::Null
        };
        Some(self.program.run_text(text, m, self.limits, |v| {
            out(v);
            ControlFlow::Continue(())
        }))
    }

    fn apply(&self, parts: &mut Parts, meta: &Meta) -> Result<(), String> {
        let mut outs = Vec::with_capacity(1);
        self.expand(parts.clone(), meta, &mut outs)?;
        match <[Parts; 1]>::try_from(outs) {
            Ok([one]) => {
                *parts = one;
                Ok(())
            }
            Err(outs) => Err(format!("{} outputs where one was expected", outs.len())),
        }
    }

    fn expand(&self, parts: Parts, meta: &Meta, out: &mut Vec<Parts>) -> Result<(), String> {
        if parts.tombstone {
            out.push(parts);
            return Ok(());
        }
        let m = if self.meta {
            meta_value(&parts, meta)
        } else {
            Value::Null
        };
        self.program.run(&parts.value, &m, self.limits, |value| {
            out.push(Parts {
                value,
                key: parts.key.clone(),
                tombstone: false,
                op: parts.op,
            });
            ControlFlow::Continue(())
        })
    }

    fn reads_headers(&self) -> bool {
        self.meta
    }

    fn several(&self) -> bool {
        self.limits.outputs > 1
    }

    fn on_error(&self) -> &OnError {
        &self.on_error
    }
}

/// The text of each output of `code` on the JSON text `input`, or the error; for tests.
#[cfg(test)]
pub(crate) fn text_outputs(code: &str, input: &[u8], meta: Val) -> Result<Vec<String>, String> {
    let mut outs = Vec::new();
    let limits = Limits {
        work: 100,
        outputs: 10,
    };
    Program::compile(code)?.run_text(input, meta, limits, |v| {
        outs.push(String::from_utf8(v).expect("JSON text"));
        ControlFlow::Continue(())
    })?;
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_numbers_by_the_grammar() {
        for (t, ok) in [
            ("0", true),
            ("-0", true),
            ("1.50", true),
            ("-0.000000000000000000001", true),
            ("12345678901234567890123456789012345678", true),
            ("1e5", true),
            ("1E+5", true),
            ("2.5e-3", true),
            ("01", false),
            ("+1", false),
            ("1.", false),
            (".5", false),
            ("1e", false),
            ("NaN", false),
            ("Infinity", false),
            ("-Infinity", false),
            ("", false),
            ("-", false),
        ] {
            assert_eq!(json_number(t.as_bytes()), ok, "{t}");
        }
    }

    #[test]
    fn outputs_without_json_text_are_errors() {
        for code in ["nan", "infinite", "\"a\" | tobytes", "{(1): 2}", "[1, nan]"] {
            let e = run(code, json!({})).expect_err(code);
            assert!(e.contains("an output is not JSON"), "{code}: {e}");
        }
    }

    #[test]
    fn text_in_text_out_keeps_numbers_and_strings() {
        let outs = text_outputs(
            ". + {x: .a}",
            br#"{"a":1.50,"b":12345678901234567890123456789012345678,"s":"\u00e9\"\n"}"#,
            Val::Null,
        )
        .unwrap();
        assert_eq!(
            outs,
            [r#"{"a":1.50,"b":12345678901234567890123456789012345678,"s":"é\"\n","x":1.50}"#]
        );
    }

    fn run(code: &str, input: Value) -> Result<Vec<Value>, String> {
        let p = Program::compile(code)?;
        let mut outs = Vec::new();
        let meta = json!({"topic": "orders", "key": "k1"});
        p.run(
            &input,
            &meta,
            Limits {
                work: 10_000,
                outputs: 100,
            },
            |v| {
                outs.push(v);
                ControlFlow::Continue(())
            },
        )?;
        Ok(outs)
    }

    #[test]
    fn outputs_are_the_program_outputs_and_meta_is_bound() {
        assert_eq!(run(".a + 1", json!({"a": 1})).unwrap(), vec![json!(2)]);
        assert_eq!(run("empty", json!({"a": 1})).unwrap(), Vec::<Value>::new());
        assert_eq!(
            run(
                ".items[] | {id: ., topic: $meta.topic}",
                json!({"items": [1, 2]})
            )
            .unwrap(),
            vec![
                json!({"id": 1, "topic": "orders"}),
                json!({"id": 2, "topic": "orders"})
            ]
        );
        assert_eq!(run("$meta.key", json!(null)).unwrap(), vec![json!("k1")]);
        // jq's own library is there: map, select, tojson, ...
        assert_eq!(
            run("[.[] | select(. > 1)] | map(. * 2)", json!([1, 2, 3])).unwrap(),
            vec![json!([4, 6])]
        );
    }

    #[test]
    fn compile_errors_say_what_and_where() {
        let e = Program::compile(".a |").unwrap_err();
        assert!(e.contains("line 1, column 5"), "{e}");
        let e = Program::compile(".a\n| foo(1)").unwrap_err();
        assert!(
            e.contains("undefined filter `foo` at line 2, column 3"),
            "{e}"
        );
        let e = Program::compile("$nope").unwrap_err();
        assert!(
            e.contains("undefined variable `$nope` at line 1, column 1"),
            "{e}"
        );
        let e = Program::compile("def f: f; f").unwrap_err();
        assert!(e.contains("`f`") && e.contains("calls itself"), "{e}");
        let e = Program::compile("def g(x): def h: g(x); h; g(1)").unwrap_err();
        assert!(e.contains("`g`") && e.contains("calls itself"), "{e}");
        let e = Program::compile("module {}; def f: f; f").unwrap_err();
        assert!(e.contains("module headers"), "{e}");
        // A definition that calls another one is fine.
        Program::compile("def f: 1; def g: f + 1; g").unwrap();
    }

    #[test]
    fn unbounded_iteration_hits_the_work_limit() {
        for code in [
            "[repeat(1)]",
            "[range(1e12)] | length",
            "last(range(0; 1e12; 1))",
            "[recurse(. + 1)]",
            "0 | until(. < 0; . + 1)",
            "[0 | while(true; . + 1)]",
            "[limit(1e9; repeat(1))]",
        ] {
            let e = run(code, json!(0)).unwrap_err();
            assert!(e.contains("work limit"), "{code}: {e}");
        }
        // A caught limit fails the record all the same.
        for code in [
            "try [repeat(1)] catch 0",
            "[range(1e9)]? // 0",
            "first(range(9)), (try last(range(1e9)) catch 1)",
        ] {
            let e = run(code, json!(0)).unwrap_err();
            assert!(e.contains("work limit"), "{code}: {e}");
        }
        // Within the limit, the same builtins work as jq's.
        assert_eq!(run("[range(3)]", json!(0)).unwrap(), vec![json!([0, 1, 2])]);
        assert_eq!(
            run("[limit(3; repeat(1))]", json!(0)).unwrap(),
            vec![json!([0, 1, 1])]
        );
        assert_eq!(
            run("[0 | while(. < 3; . + 1)]", json!(0)).unwrap(),
            vec![json!([0, 1, 2])]
        );
        // The budget is per record: a second run starts afresh.
        let p = Program::compile("[range(6000)] | length").unwrap();
        for _ in 0..3 {
            let mut outs = Vec::new();
            p.run(
                &json!(0),
                &json!({}),
                Limits {
                    work: 10_000,
                    outputs: 10,
                },
                |v| {
                    outs.push(v);
                    ControlFlow::Continue(())
                },
            )
            .unwrap();
            assert_eq!(outs, vec![json!(6000)]);
        }
    }

    #[test]
    fn builtins_that_stop_the_process_or_differ_on_a_replay_are_refused() {
        for code in [
            "halt",
            "halt_error",
            "\"x\" | halt_error(1)",
            "env",
            "now",
            "localtime",
        ] {
            let e = run(code, json!(0)).unwrap_err();
            assert!(e.contains("not available to a job"), "{code}: {e}");
        }
        // Other inputs are not even defined.
        let e = run("input", json!(0)).unwrap_err();
        assert!(e.contains("undefined filter `input`"), "{e}");
        // Time functions over the record's own values stay.
        assert_eq!(
            run("0 | todate", json!(0)).unwrap(),
            vec![json!("1970-01-01T00:00:00Z")]
        );
    }

    #[test]
    fn outputs_are_limited() {
        let e = run(".[]", json!((0..101).collect::<Vec<_>>())).unwrap_err();
        assert!(e.contains("more than 100 outputs"), "{e}");
    }

    #[test]
    fn program_errors_are_errors() {
        let e = run(r#"error("bad record")"#, json!(0)).unwrap_err();
        assert!(e.contains("bad record"), "{e}");
        let e = run(".a + 1", json!({"a": "x"})).unwrap_err();
        assert!(!e.is_empty());
    }

    #[test]
    fn the_transform_keeps_key_operation_and_passes_tombstones() {
        let jq = Jq::new(".[] | {n: .}").unwrap();
        let meta = Meta::default();
        let parts = Parts {
            value: json!([1, 2]),
            key: Some(b"k".to_vec()),
            tombstone: false,
            op: crate::record::Op::Delete,
        };
        let mut out = Vec::new();
        jq.expand(parts, &meta, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|p| p.key.as_deref() == Some(&b"k"[..]) && p.op == crate::record::Op::Delete));
        assert_eq!(out[1].value, json!({"n": 2}));
        let tomb = Parts {
            value: Value::Null,
            key: Some(b"k".to_vec()),
            tombstone: true,
            op: crate::record::Op::Upsert,
        };
        let mut out = Vec::new();
        jq.expand(tomb.clone(), &meta, &mut out).unwrap();
        assert_eq!(out, vec![tomb]);
    }

    /// `$meta` built for the text path (`meta_val`) and for the tree path
    /// (`meta_value`) are one value, whatever the record carries.
    #[test]
    fn meta_is_the_same_value_on_both_paths() {
        let headers = vec![
            ("trace".to_string(), Some(bytes::Bytes::from_static(b"abc"))),
            ("empty".to_string(), None),
            (
                "trace".to_string(),
                Some(bytes::Bytes::from_static(b"last")),
            ),
            (
                "bin".to_string(),
                Some(bytes::Bytes::from_static(b"\xff\x00")),
            ),
        ];
        let full = Meta {
            topic: Some("orders"),
            partition: Some(3),
            offset: Some(9),
            timestamp: Some(-1),
            headers: Some(&headers),
        };
        let bare = Meta {
            topic: None,
            partition: None,
            offset: None,
            timestamp: None,
            headers: None,
        };
        for meta in [&full, &bare] {
            for key in [None, Some(&b"u-1"[..]), Some(&b"\xfe"[..]), Some(&b""[..])] {
                let parts = Parts {
                    key: key.map(<[u8]>::to_vec),
                    ..Parts::of_value(json!({}))
                };
                let mut text = Vec::new();
                write_json(&meta_val(key, meta), &mut text).unwrap();
                let from_val: Value = serde_json::from_slice(&text).unwrap();
                assert_eq!(from_val, meta_value(&parts, meta), "key {key:?}");
            }
        }
    }

    #[test]
    fn meta_holds_key_coordinates_and_headers() {
        let headers = vec![
            ("trace".to_string(), Some(bytes::Bytes::from_static(b"abc"))),
            ("empty".to_string(), None),
        ];
        let meta = Meta {
            topic: Some("orders"),
            partition: Some(3),
            offset: Some(9),
            timestamp: Some(1_700_000_000_000),
            headers: Some(&headers),
        };
        let parts = Parts {
            key: Some(b"u-1".to_vec()),
            ..Parts::of_value(json!({}))
        };
        assert_eq!(
            meta_value(&parts, &meta),
            json!({"key": "u-1", "topic": "orders", "partition": 3, "offset": 9,
                   "timestamp": 1_700_000_000_000i64, "headers": {"trace": "abc", "empty": null}})
        );
    }
}
