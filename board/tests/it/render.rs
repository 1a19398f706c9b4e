//! The `inferloopd board` text.

use inferloop_board::{render_detection, Detector, NoGpuProbe};

use crate::fixture;

#[test]
fn rendered_detection_says_which_file_matched_and_the_profile_numbers() {
    let d = Detector::new(fixture("orin-nx-16gb"))
        .with_gpu_probe(NoGpuProbe)
        .detect()
        .expect("detected");
    let text = render_detection(&d);
    for expected in [
        "board:       jetson-orin-nx-16gb (NVIDIA Jetson Orin NX 16GB)",
        "proc/device-tree/compatible lists \"nvidia,p3767-0000\"",
        "8 cores (8 online)",
        "16.0 GiB",
        "unified with the GPU",
        "102.4 GB/s theoretical",
        "8 SMs, sm_87, max 918 MHz",
        "0 MAXN, 1 10W, 2 15W (default), 3 25W",
        "gpu-thermal: throttle 99.0 °C, critical 104.5 °C",
        "perf floors: none",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn rendered_cpu_fallback_lists_the_notes() {
    let d = Detector::new(fixture("x86"))
        .with_gpu_probe(NoGpuProbe)
        .with_arch("x86_64")
        .detect()
        .expect("detected");
    let text = render_detection(&d);
    assert!(
        text.contains("cpu architecture fallback (x86_64)"),
        "{text}"
    );
    assert!(text.contains("notes:"), "{text}");
    assert!(text.contains("2 online"), "{text}");
}
