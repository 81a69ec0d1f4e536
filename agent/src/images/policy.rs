//! imagePullPolicy: the API server's defaulting and the kubelet's decision
//! to pull.

use super::reference::Reference;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy: as given, or defaulted as the API server
    /// does when empty (`SetDefaults_Container`): `Always` when the tag is
    /// `latest` (written or implied by no tag and no digest), else
    /// `IfNotPresent` (also for a name that does not parse, which then
    /// fails as InvalidImageName). A value outside the three is rejected by
    /// validation upstream; here it never pulls, as the kubelet's
    /// `shouldPullImage` treats it.
    pub fn effective(policy: Option<&str>, image: &str) -> PullPolicy {
        match policy.unwrap_or("") {
            "Always" => PullPolicy::Always,
            "IfNotPresent" => PullPolicy::IfNotPresent,
            "Never" => PullPolicy::Never,
            "" => match Reference::parse(image).ok().as_ref().and_then(Reference::effective_tag) {
                Some("latest") => PullPolicy::Always,
                _ => PullPolicy::IfNotPresent,
            },
            _ => PullPolicy::Never,
        }
    }

    /// `shouldPullImage`.
    pub fn should_pull(self, present: bool) -> bool {
        match self {
            PullPolicy::Always => true,
            PullPolicy::IfNotPresent => !present,
            PullPolicy::Never => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaulting() {
        let d = "sha256:2d4e459f4ecb5329407ae3e47cbc107a2fbace221354ca75960af4c047b3cb13";
        let cases: Vec<(Option<&str>, String, PullPolicy)> = vec![
            (None, "busybox".into(), PullPolicy::Always),
            (Some(""), "busybox:latest".into(), PullPolicy::Always),
            (None, "localhost:5000/app".into(), PullPolicy::Always),
            (None, "busybox:1.36".into(), PullPolicy::IfNotPresent),
            (None, format!("busybox@{d}"), PullPolicy::IfNotPresent),
            (None, format!("busybox:latest@{d}"), PullPolicy::Always),
            (None, "Not A Name".into(), PullPolicy::IfNotPresent),
            (Some("Always"), "busybox:1.36".into(), PullPolicy::Always),
            (Some("Never"), "busybox".into(), PullPolicy::Never),
            (Some("IfNotPresent"), "busybox".into(), PullPolicy::IfNotPresent),
            (Some("Sometimes"), "busybox".into(), PullPolicy::Never),
        ];
        for (policy, image, want) in cases {
            assert_eq!(PullPolicy::effective(policy, &image), want, "{policy:?} {image}");
        }
    }

    #[test]
    fn should_pull() {
        let cases = [
            (PullPolicy::Always, true, true),
            (PullPolicy::Always, false, true),
            (PullPolicy::IfNotPresent, true, false),
            (PullPolicy::IfNotPresent, false, true),
            (PullPolicy::Never, true, false),
            (PullPolicy::Never, false, false),
        ];
        for (p, present, want) in cases {
            assert_eq!(p.should_pull(present), want, "{p:?} present={present}");
        }
    }
}
