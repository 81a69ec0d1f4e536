use super::*;

fn parsed(args: &[&str]) -> ParsedFlags {
    parse(args.iter().copied()).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn str_of(p: &ParsedFlags, name: &str) -> String {
    p.string(name).unwrap_or_else(|| panic!("{name} not set")).to_owned()
}

fn map_of(p: &ParsedFlags, name: &str) -> Vec<(String, String)> {
    match &p.get(name).unwrap().value {
        Value::Map(e) => e
            .iter()
            .map(|(k, v)| match &v.value {
                Value::Str(s) => (k.clone(), s.clone()),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

fn list_of(p: &ParsedFlags, name: &str) -> Vec<String> {
    match &p.get(name).unwrap().value {
        Value::List(items) => items
            .iter()
            .map(|n| match &n.value {
                Value::Str(s) => s.clone(),
                other => format!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn flag_forms() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--max-pods=50"], "max-pods", "50"),
        (&["--max-pods", "50"], "max-pods", "50"),
        (&["--max_pods=50"], "max-pods", "50"),
        (&["--register-node"], "register-node", "true"),
        (&["--register-node=false"], "register-node", "false"),
        (&["--register-node=0"], "register-node", "0"),
        (&["-v", "4"], "v", "4"),
        (&["-v=4"], "v", "4"),
        (&["-v4"], "v", "4"),
        (&["--v=3"], "v", "3"),
        (&["--hostname-override="], "hostname-override", ""),
        (&["--kubeconfig", "--weird-but-a-value"], "kubeconfig", "--weird-but-a-value"),
        (&["--max-pods=1", "--max-pods=2"], "max-pods", "2"),
        (&["--max-pods=1", "--max-pods", "3"], "max-pods", "3"),
        (&["--node-ip=10.0.0.1,fd00::1"], "node-ip", "10.0.0.1,fd00::1"),
        (&["-h"], "help", "true"),
        (&["--version=raw"], "version", "raw"),
    ];
    for (args, name, want) in cases {
        assert_eq!(str_of(&parsed(args), name), *want, "{args:?}");
    }
}

#[test]
fn bool_flag_does_not_consume_the_next_argument() {
    let err = parse(["--register-node", "false"]).unwrap_err();
    assert_eq!(err.to_string(), "command line: unexpected argument \"false\" (flags start with --)");
}

#[test]
fn map_flags_merge_within_the_command_line() {
    let p = parsed(&["--kube-reserved=cpu=1,memory=2Gi", "--kube-reserved", "memory=3Gi, ephemeral-storage = 1Gi"]);
    assert_eq!(
        map_of(&p, "kube-reserved"),
        vec![("cpu".into(), "1".into()), ("memory".into(), "3Gi".into()), ("ephemeral-storage".into(), "1Gi".into())]
    );
    let p = parsed(&["--eviction-hard=memory.available<500Mi,nodefs.available<10%"]);
    assert_eq!(
        map_of(&p, "eviction-hard"),
        vec![("memory.available".into(), "500Mi".into()), ("nodefs.available".into(), "10%".into())]
    );
    let p = parsed(&["--node-labels=a=b,c=d=e", "--feature-gates=A=true,B=false"]);
    assert_eq!(map_of(&p, "node-labels"), vec![("a".into(), "b".into()), ("c".into(), "d=e".into())]);
    assert_eq!(map_of(&p, "feature-gates"), vec![("A".into(), "true".into()), ("B".into(), "false".into())]);
    assert!(map_of(&parsed(&["--eviction-hard="]), "eviction-hard").is_empty());
}

#[test]
fn list_flags_append_after_the_first() {
    let p = parsed(&["--enforce-node-allocatable=pods", "--enforce-node-allocatable=kube-reserved,system-reserved"]);
    assert_eq!(list_of(&p, "enforce-node-allocatable"), vec!["pods", "kube-reserved", "system-reserved"]);
    assert!(list_of(&parsed(&["--enforce-node-allocatable="]), "enforce-node-allocatable").is_empty());
}

#[test]
fn taint_flags() {
    let p = parsed(&["--register-with-taints=a=b:NoSchedule,c:NoExecute,d"]);
    let Value::List(items) = &p.get("register-with-taints").unwrap().value else { panic!() };
    let keys: Vec<Vec<String>> = items
        .iter()
        .map(|n| {
            let Value::Map(e) = &n.value else { panic!() };
            e.iter().map(|(k, v)| format!("{k}={:?}", v.value)).collect()
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            vec!["key=Str(\"a\")", "value=Str(\"b\")", "effect=Str(\"NoSchedule\")"],
            vec!["key=Str(\"c\")", "effect=Str(\"NoExecute\")"],
            vec!["key=Str(\"d\")"],
        ]
    );
}

#[test]
fn errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--nope=1"], "flag --nope: unknown flag (swiftlet --help lists the flags)"),
        (&["--kubeconfig"], "flag --kubeconfig: needs a value"),
        (&["stray"], "command line: unexpected argument \"stray\" (flags start with --)"),
        (&["--", "x"], "command line: unexpected argument \"x\""),
        (&["---x"], "command line: bad flag syntax: ---x"),
        (&["-x"], "command line: unknown shorthand flag 'x' in -x (flags start with --)"),
        (
            &["--eviction-hard=memory.available>1Gi"],
            "flag --eviction-hard: \"memory.available>1Gi\" is not a threshold: expected <signal><<value>, \
             e.g. memory.available<100Mi (the operator must be <)",
        ),
        (&["--kube-reserved=cpu"], "flag --kube-reserved: \"cpu\" is not a key=value pair"),
        (
            &["--register-with-taints=a:b:c"],
            "flag --register-with-taints: \"a:b:c\" is not a taint: expected <key>=<value>:<effect> or <key>:<effect>",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(parse(args.iter().copied()).unwrap_err().to_string(), *want, "{args:?}");
    }
}

#[test]
fn table_is_sorted_and_unique() {
    for w in FLAGS.windows(2) {
        assert!(w[0].name < w[1].name, "{} must sort before {}", w[0].name, w[1].name);
    }
}

#[test]
fn help_lists_every_flag() {
    let h = help_text(|_| None);
    for f in FLAGS {
        assert!(h.contains(&format!("--{} ", f.name)), "--{} missing from help", f.name);
    }
    assert!(h.contains("-v, --v int32"));
}
