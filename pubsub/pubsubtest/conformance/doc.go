// Package conformance checks that a logbus engine keeps the promises of
// the pubsub package: ordering, groups, at-least-once delivery, retries
// and dead letters, backpressure, start positions, seek and replay,
// pause, Drain, Close, streams, batches, the lifecycle and the errors.
//
// [RunConformance] runs every case as a subtest named for the sentence it
// checks. The optional promises an engine keeps are read from the engine
// itself ([engine.Capabilities], through pubsub.Broker.Capabilities); a
// case that needs one it lacks is skipped by name, and so is one that
// needs a capability the engine keeps but declares the suite cannot check
// ([Engine].Untestable, with the reason). The run ends with a summary of
// every skip. The in-memory engine passes with every capability.
package conformance
