//! Keyed load, from the Slicelets that measure it to the Assigner that balances it.
//!
//! * [`LoadReport`](steady_slicelet::LoadReport) (`steady-slicelet`'s, which builds and
//!   sends it): what one backend task measured for the slices it held in one generation,
//!   and its heaviest keys; validated when built (bounded in size).
//! * [`LoadBook`]: the Assigner's side: the latest report of every known task, accepted
//!   only for the job's recent generations and known tasks (the rest is dropped and
//!   counted), read back fresh for each run; and the latest report of each client that
//!   reports load per key range (gRFC A119; [`LoadBook::accept_client`]), bounded per
//!   job ([`ClientLimits`]).
//! * [`LoadCollector`]: the gRPC server of `LoadCollector.Report` (`steady.load.v1`,
//!   in `steady_proto::load`): validates each streamed message (version
//!   [`REPORT_VERSION`](steady_slicelet::report::REPORT_VERSION), then the report;
//!   [`MessageError`](steady_slicelet::report::MessageError)) and feeds the book. Its
//!   client is `Slicelet::report_to`.

mod book;
mod collector;
mod reporters;

pub use book::{ClientLimits, ClientReceived, Dropped, LoadBook, Received, MAX_CLIENT_ID_BYTES};
pub use collector::LoadCollector;
pub use reporters::{PatternError, ReporterNames};
