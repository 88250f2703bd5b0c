//! The paths types had before they moved keep naming the same types for one release:
//! code written against them compiles, and means what it meant. (A compile-time check:
//! if a re-export is dropped or points at another type, this file stops compiling.)

use std::marker::PhantomData;

/// Compiles only when both arguments name the same type.
fn same<T>(_: PhantomData<T>, _: PhantomData<T>) {}

#[test]
fn the_shared_types_keep_their_balancer_paths() {
    same(PhantomData::<steady_balance::JobView<u8>>, PhantomData::<steady_core::JobView<u8>>);
    same(PhantomData::<steady_balance::Task<u8>>, PhantomData::<steady_core::Task<u8>>);
    same(PhantomData::<steady_balance::TaskState>, PhantomData::<steady_core::TaskState>);
    same(PhantomData::<steady_balance::Backoff>, PhantomData::<steady_core::Backoff>);
    same(PhantomData::<steady_balance::ConfigError>, PhantomData::<steady_core::ConfigError>);
}

#[test]
fn the_protocol_keeps_its_channel_paths() {
    same(
        PhantomData::<steady_tonic::proto::AssignmentUpdate>,
        PhantomData::<steady_proto::assignment::AssignmentUpdate>,
    );
    same(PhantomData::<steady_tonic::load_proto::LoadReport>, PhantomData::<steady_proto::load::LoadReport>);
    same(PhantomData::<steady_tonic::echo::EchoRequest>, PhantomData::<steady_proto::echo::EchoRequest>);
    same(PhantomData::<steady_tonic::WatchError>, PhantomData::<steady_proto::WatchError>);
    assert_eq!(steady_tonic::DEFAULT_KEY_HEADER, steady_proto::DEFAULT_KEY_HEADER);
}
