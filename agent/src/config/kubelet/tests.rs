use super::*;

#[test]
fn quantities_print_as_kubernetes_does() {
    for (input, want) in [
        ("500m", "500m"),
        ("1", "1"),
        ("1.5", "1500m"),
        ("2Gi", "2Gi"),
        ("100Mi", "100Mi"),
        ("1536Mi", "1536Mi"),
        ("100M", "100M"),
        ("1000", "1k"),
        ("1537", "1537"),
        ("0", "0"),
        ("10Mi", "10Mi"),
    ] {
        assert_eq!(format_quantity(&input.parse().unwrap()), want, "{input}");
    }
}
