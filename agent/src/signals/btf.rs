//! A reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`), just enough to
//! find struct member offsets, enum values and tracepoint prototypes.
//!
//! Rust eBPF programs get no CO-RE relocations, so the agent looks up the
//! offsets the programs need in the running kernel's BTF and passes them in
//! as load-time constants ([`swiftlet_common::KernelLayout`]).

use std::{collections::HashMap, path::Path};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF has no {kind} named `{name}`")]
    NotFound { kind: &'static str, name: String },
    #[error("`{container}` has no member `{member}`")]
    NoMember { container: String, member: String },
}

const MAGIC: u16 = 0xeb9f;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int = 1,
    Ptr = 2,
    Array = 3,
    Struct = 4,
    Union = 5,
    Enum = 6,
    Fwd = 7,
    Typedef = 8,
    Volatile = 9,
    Const = 10,
    Restrict = 11,
    Func = 12,
    FuncProto = 13,
    Var = 14,
    Datasec = 15,
    Float = 16,
    DeclTag = 17,
    TypeTag = 18,
    Enum64 = 19,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Int,
            2 => Ptr,
            3 => Array,
            4 => Struct,
            5 => Union,
            6 => Enum,
            7 => Fwd,
            8 => Typedef,
            9 => Volatile,
            10 => Const,
            11 => Restrict,
            12 => Func,
            13 => FuncProto,
            14 => Var,
            15 => Datasec,
            16 => Float,
            17 => DeclTag,
            18 => TypeTag,
            19 => Enum64,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    /// Offset in bits.
    bit_offset: u32,
}

#[derive(Debug, Clone)]
struct Type {
    name: u32,
    kind: Kind,
    /// Size for structs/unions/enums/ints; referenced type otherwise.
    size_or_type: u32,
    members: Vec<Member>,
    enum_values: Vec<(u32, i64)>,
    params: usize,
    /// Parameter types of a function prototype.
    param_types: Vec<u32>,
}

/// Parsed kernel BTF.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    by_name: HashMap<(String, u8), u32>,
}

fn u16_at(b: &[u8], off: usize) -> Result<u16, BtfError> {
    b.get(off..off + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.display().to_string(), source })?;
        Btf::parse(&data)
    }

    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if u16_at(data, 0)? != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();
        let tb = data.get(types_start..types_end).ok_or(BtfError::Malformed("type section out of bounds"))?;

        // Type id 0 is void.
        let mut types = vec![Type {
            name: 0,
            kind: Kind::Int,
            size_or_type: 0,
            members: vec![],
            enum_values: vec![],
            params: 0,
            param_types: vec![],
        }];
        let mut off = 0;
        while off < tb.len() {
            let name = u32_at(tb, off)?;
            let info = u32_at(tb, off + 4)?;
            let size_or_type = u32_at(tb, off + 8)?;
            off += 12;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let kind = Kind::from_u32((info >> 24) & 0x1f).ok_or(BtfError::Malformed("unknown kind"))?;
            let mut t =
                Type { name, kind, size_or_type, members: vec![], enum_values: vec![], params: 0, param_types: vec![] };
            match kind {
                Kind::Int | Kind::Var | Kind::DeclTag => off += 4,
                Kind::Array => off += 12,
                Kind::Struct | Kind::Union => {
                    for _ in 0..vlen {
                        let m_off = u32_at(tb, off + 8)?;
                        t.members.push(Member {
                            name: u32_at(tb, off)?,
                            ty: u32_at(tb, off + 4)?,
                            bit_offset: if kind_flag { m_off & 0xff_ffff } else { m_off },
                        });
                        off += 12;
                    }
                }
                Kind::Enum => {
                    for _ in 0..vlen {
                        t.enum_values.push((u32_at(tb, off)?, u32_at(tb, off + 4)? as i32 as i64));
                        off += 8;
                    }
                }
                Kind::Enum64 => {
                    for _ in 0..vlen {
                        let lo = u32_at(tb, off + 4)? as u64;
                        let hi = u32_at(tb, off + 8)? as u64;
                        t.enum_values.push((u32_at(tb, off)?, ((hi << 32) | lo) as i64));
                        off += 12;
                    }
                }
                Kind::FuncProto => {
                    t.params = vlen;
                    for _ in 0..vlen {
                        t.param_types.push(u32_at(tb, off + 4)?);
                        off += 8;
                    }
                }
                Kind::Datasec => off += 12 * vlen,
                Kind::Ptr
                | Kind::Fwd
                | Kind::Typedef
                | Kind::Volatile
                | Kind::Const
                | Kind::Restrict
                | Kind::Func
                | Kind::Float
                | Kind::TypeTag => {}
            }
            types.push(t);
        }
        let mut btf = Btf { types, strings, by_name: HashMap::new() };
        for id in 1..btf.types.len() {
            let t = &btf.types[id];
            if t.name != 0 {
                let name = btf.str(t.name).to_owned();
                // The first definition wins: a forward declaration comes
                // later than, or instead of, the full one.
                btf.by_name.entry((name, t.kind as u8)).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn str(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn find(&self, name: &str, kind: Kind) -> Option<u32> {
        self.by_name.get(&(name.to_owned(), kind as u8)).copied()
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize).map(|t| t.kind) {
                Some(Kind::Typedef | Kind::Volatile | Kind::Const | Kind::Restrict | Kind::TypeTag) => {
                    id = self.types[id as usize].size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// Finds `name` among a struct's members, looking inside anonymous
    /// structs and unions (to a bounded depth, so malformed BTF with a cycle
    /// cannot recurse forever). Returns (bit offset, member type).
    fn member(&self, container: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.types.get(container as usize)?;
        for m in &t.members {
            if m.name == 0 {
                if depth >= 8 {
                    continue;
                }
                let inner = self.resolve(m.ty);
                if let Some((off, ty)) = self.member(inner, name, depth + 1) {
                    return Some((m.bit_offset.checked_add(off)?, ty));
                }
            } else if self.str(m.name) == name {
                return Some((m.bit_offset, m.ty));
            }
        }
        None
    }

    /// Byte offset of a dotted member path inside a struct, e.g.
    /// `member_offset("mem_cgroup", "memory.usage")`.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        let mut ty = self
            .find(struct_name, Kind::Struct)
            .ok_or_else(|| BtfError::NotFound { kind: "struct", name: struct_name.to_owned() })?;
        let mut bits = 0;
        let mut container = struct_name.to_owned();
        for part in path.split('.') {
            let (off, member_ty) = self
                .member(self.resolve(ty), part, 0)
                .ok_or_else(|| BtfError::NoMember { container: container.clone(), member: part.to_owned() })?;
            bits = off.checked_add(bits).ok_or(BtfError::Malformed("member offset overflows"))?;
            ty = member_ty;
            container = format!("{container}.{part}");
        }
        if bits % 8 != 0 {
            return Err(BtfError::Malformed("member is a bitfield"));
        }
        Ok(bits / 8)
    }

    /// The value of an enumerator, e.g. `enum_value("node_stat_item", "NR_INACTIVE_FILE")`.
    pub fn enum_value(&self, enum_name: &str, variant: &str) -> Result<i64, BtfError> {
        let not_found = || BtfError::NotFound { kind: "enumerator", name: format!("{enum_name}::{variant}") };
        let id =
            self.find(enum_name, Kind::Enum).or_else(|| self.find(enum_name, Kind::Enum64)).ok_or_else(not_found)?;
        self.types[id as usize]
            .enum_values
            .iter()
            .find(|(n, _)| self.str(*n) == variant)
            .map(|(_, v)| *v)
            .ok_or_else(not_found)
    }

    /// Number of arguments a BTF tracepoint passes to programs, or None when
    /// the kernel has no such tracepoint (`btf_trace_<name>` typedef).
    pub fn tracepoint_args(&self, name: &str) -> Option<usize> {
        let td = self.find(&format!("btf_trace_{name}"), Kind::Typedef)?;
        let ptr = self.resolve(td);
        let proto = self.types.get(ptr as usize)?;
        if proto.kind != Kind::Ptr {
            return None;
        }
        let f = self.types.get(self.resolve(proto.size_or_type) as usize)?;
        // The first parameter is the tracepoint's private `void *data`.
        (f.kind == Kind::FuncProto).then(|| f.params.saturating_sub(1))
    }

    /// Whether argument `index` of a BTF tracepoint (counting from 0, after
    /// the private `void *data`) is a pointer; None when there is no such
    /// tracepoint or argument. Tracepoints change their arguments between
    /// kernels (`mark_victim` took a pid before it took the task).
    pub fn tracepoint_arg_is_pointer(&self, name: &str, index: usize) -> Option<bool> {
        let td = self.find(&format!("btf_trace_{name}"), Kind::Typedef)?;
        let ptr = self.types.get(self.resolve(td) as usize)?;
        if ptr.kind != Kind::Ptr {
            return None;
        }
        let f = self.types.get(self.resolve(ptr.size_or_type) as usize)?;
        let ty = *f.param_types.get(index + 1)?;
        Some(self.types.get(self.resolve(ty) as usize)?.kind == Kind::Ptr)
    }

    /// True when the kernel has a function (e.g. a kfunc) of that name.
    pub fn has_func(&self, name: &str) -> bool {
        self.find(name, Kind::Func).is_some()
    }

    /// The BTF type id of a kernel function, which is how a program names a
    /// kfunc it calls.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(name, Kind::Func)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: `struct inner { long usage; }`,
    /// `struct outer { int a; union { struct inner memory; }; }`,
    /// `enum e { A = 0, B = 7 }`, and `btf_trace_x` (two ints) and
    /// `btf_trace_z` (a pointer) typedefs.
    fn sample() -> Vec<u8> {
        let mut strings = b"\0inner\0usage\0outer\0a\0memory\0e\0A\0B\0long\0int\0btf_trace_x\0btf_trace_z\0".to_vec();
        let s = |name: &str, strings: &Vec<u8>| -> u32 {
            let needle = format!("\0{name}\0");
            strings.windows(needle.len()).position(|w| w == needle.as_bytes()).map(|p| p as u32 + 1).unwrap()
        };
        let mut t: Vec<u32> = vec![];
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        // 1: long (int, 8 bytes)
        t.extend([s("long", &strings), info(1, 0), 8, 64]);
        // 2: int
        t.extend([s("int", &strings), info(1, 0), 4, 32]);
        // 3: struct inner { long usage @0 }
        t.extend([s("inner", &strings), info(4, 1), 8, s("usage", &strings), 1, 0]);
        // 4: anonymous union { struct inner memory @0 }
        t.extend([0, info(5, 1), 8, s("memory", &strings), 3, 0]);
        // 5: struct outer { int a @0; union @64 }
        t.extend([s("outer", &strings), info(4, 2), 16, s("a", &strings), 2, 0, 0, 4, 64]);
        // 6: enum e { A=0, B=7 }
        t.extend([s("e", &strings), info(6, 2), 4, s("A", &strings), 0, s("B", &strings), 7]);
        // 7: func proto (void *, int, int) -> void
        t.extend([0, info(13, 3), 0, 0, 1, 0, 2, 0, 2]);
        // 8: ptr to 7
        t.extend([0, info(2, 0), 7]);
        // 9: typedef btf_trace_x -> 8
        t.extend([s("btf_trace_x", &strings), info(8, 0), 8]);
        // 10: ptr to struct inner; 11: func proto (void *, struct inner *);
        // 12: ptr to 11; 13: typedef btf_trace_z -> 12
        t.extend([0, info(2, 0), 3]);
        t.extend([0, info(13, 2), 0, 0, 1, 0, 10]);
        t.extend([0, info(2, 0), 11]);
        t.extend([s("btf_trace_z", &strings), info(8, 0), 12]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![];
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        out.extend(24u32.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend((types.len() as u32).to_le_bytes());
        out.extend((types.len() as u32).to_le_bytes());
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(types);
        out.append(&mut strings);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "memory").unwrap(), 8);
        assert_eq!(btf.member_offset("outer", "memory.usage").unwrap(), 8);
        assert!(matches!(btf.member_offset("outer", "memory.nope"), Err(BtfError::NoMember { .. })));
        assert!(matches!(btf.member_offset("nope", "a"), Err(BtfError::NotFound { .. })));
    }

    #[test]
    fn reads_enums_and_tracepoint_arity() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.enum_value("e", "B").unwrap(), 7);
        assert!(btf.enum_value("e", "C").is_err());
        assert_eq!(btf.tracepoint_args("x"), Some(2));
        assert_eq!(btf.tracepoint_args("y"), None);
        // btf_trace_x(void *data, int, int): the arguments are not pointers.
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 0), Some(false));
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 1), Some(false));
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 2), None);
        assert_eq!(btf.tracepoint_arg_is_pointer("y", 0), None);
        assert_eq!(btf.tracepoint_arg_is_pointer("z", 0), Some(true));
        assert_eq!(btf.tracepoint_args("z"), Some(1));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(&[]).is_err());
        assert!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 255, 255, 0, 0]).is_err());
        let mut bad = sample();
        bad.truncate(bad.len() - 40);
        // Truncation lands in the string section; parse may fail or succeed,
        // but must not panic.
        let _ = Btf::parse(&bad);
    }
}
