//! With the `grpc` feature, generates the echo service's protobuf and tonic code with a
//! protoc that cargo itself installs (`protoc-bin-vendored`), as steady-proto does.
//! Without it, nothing: the crate stays std only (its build dependencies are optional,
//! enabled by that feature).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "grpc")]
    {
        // Safety of set_var: build scripts are single-threaded.
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
        println!("cargo:rerun-if-changed=proto");
        tonic_prost_build::configure().compile_protos(&["proto/echo.proto"], &["proto"])?;
    }
    Ok(())
}
