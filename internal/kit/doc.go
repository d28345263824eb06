// Package kit is the delivery policy both of logbus's engines keep, written
// once: what a handler's panic becomes (Call), what a batch handler's error
// means (Outcome), when a delivery is stuck (Watchdog), which records of a
// partition may run at once under key concurrency and how far its commit
// may move (KeyWindow), and how Close runs once and bounds its later
// callers (Closer, AwaitWorkers). An engine
// stores and moves records; what a promise means is decided here. It is
// internal: an engine outside this module gets the boundary (package
// engine) and the conformance suite, not this code.
package kit
