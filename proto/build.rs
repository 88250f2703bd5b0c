//! Generates the protobuf and tonic code with a protoc that cargo itself installs
//! (`protoc-bin-vendored`), so a fresh machine needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Safety of set_var: build scripts are single-threaded.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &["proto/assignment.proto", "proto/load.proto", "proto/autosharding.proto"],
        &["proto"],
    )?;
    Ok(())
}
