//! Which vector instructions the twins may use, detected once at run time.

/// The instruction set a twin's hot loop runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// x86-64 with AVX2, FMA and F16C (every AVX2 CPU has F16C; the twins convert the
    /// blocks' f16 scales with it).
    Avx2,
    /// aarch64 Advanced SIMD (always present there).
    Neon,
}

impl Isa {
    /// The best the running CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Isa::Neon;
            }
        }
        Isa::Scalar
    }

    /// Every ISA this CPU can run, for tests that compare them.
    pub fn available() -> Vec<Self> {
        let best = Self::detect();
        if best == Isa::Scalar {
            vec![Isa::Scalar]
        } else {
            vec![Isa::Scalar, best]
        }
    }
}
