// Package conformance checks that a logbus engine keeps the promises of
// the pubsub package: ordering, groups, at-least-once delivery, retries
// and dead letters, backpressure, start positions, seek and replay,
// pause, Drain, Close, streams, batches, the lifecycle and the errors.
//
// [RunConformance] runs every case as a subtest named for the sentence it
// checks. An engine declares the optional promises it keeps as
// capabilities; a case that needs one it lacks is skipped by name, and the
// run ends with a summary of every skip. The in-memory engine passes with
// every capability.
package conformance
