// Package logbus is a typed, in-process publish/subscribe message queue with
// the semantics of a Kafka log. The API lives in package pubsub; codecs in
// package codec.
package logbus
