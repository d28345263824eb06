package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsEnv is an embedded NATS server with JetStream, started for one run and
// shut down at its end, plus the client connections opened on it.
//
// The clients connect through nats.InProcessServer, a net.Pipe into the
// server, so no socket is opened and the server does not listen at all. With
// -nats-tcp they connect over TCP instead, and then the server listens on
// 127.0.0.1 only, on a port the kernel picks.
type natsEnv struct {
	srv   *server.Server
	dir   string
	tcp   bool
	conns []*nats.Conn
}

func startNATS(tcp bool) (*natsEnv, error) {
	dir, err := os.MkdirTemp("", "logbus-bench-js-")
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		Host:       "127.0.0.1",
		Port:       -1,
		DontListen: !tcp,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   dir,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
		return nil, errors.New("nats server not ready")
	}
	return &natsEnv{srv: srv, dir: dir, tcp: tcp}, nil
}

// connect opens a client connection; close closes it.
func (e *natsEnv) connect() (*nats.Conn, error) {
	url := e.srv.ClientURL()
	opts := []nats.Option{nats.NoReconnect()}
	if !e.tcp {
		opts = append(opts, nats.InProcessServer(e.srv))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	e.conns = append(e.conns, nc)
	return nc, nil
}

// close closes every connection (ending their reader and flusher goroutines
// and the subscriptions' callback goroutines), then shuts the server down and
// waits for its goroutines.
func (e *natsEnv) close() {
	for _, nc := range e.conns {
		nc.Close()
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	os.RemoveAll(e.dir)
}

// subject is partition p's subject.
func subject(p int) string { return "bench." + strconv.Itoa(p) }

// natsPeer runs NATS core: publish, subscribe, no acks. Every producer and
// every consumer has a connection of its own, as separate services would.
//
// Mapping: a subject per partition (bench.0 ...).
//   - S1: one subscription on bench.0.
//   - S2: four subscriptions on bench.0 (each plays one group, and each gets
//     every message).
//   - S3: producer p publishes to bench.p; the group is a queue group of
//     four queue subscriptions on bench.*, the NATS way of sharing a stream
//     of messages among consumers, so each message goes to one of them
//     (load-balanced per message, not per subject: no per-key order).
//
// NATS core is at most once: a subscriber too slow for the server's limits
// loses messages. The client's pending limits are lifted so the client side
// never drops; if the server drops anyway, the run fails, loudly, with the
// count that arrived.
type natsPeer struct{ tcp bool }

func (natsPeer) name() string { return "nats" }

func (p natsPeer) run(sc scenario, n int) (res result, err error) {
	env, err := startNATS(p.tcp)
	if err != nil {
		return res, err
	}
	defer env.close()

	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	var asyncErr firstErr // first error reported by a connection's async handler
	for g := range sc.groups {
		for range sc.consumers {
			nc, err := env.connect()
			if err != nil {
				return res, err
			}
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, e error) { asyncErr.set(e) })
			cb := func(m *nats.Msg) { tr.deliver(g, m.Data) }
			var sub *nats.Subscription
			if sc.consumers > 1 {
				sub, err = nc.QueueSubscribe("bench.*", "g"+strconv.Itoa(g), cb)
			} else {
				sub, err = nc.Subscribe(subject(0), cb)
			}
			if err != nil {
				return res, err
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				return res, err
			}
			// The server must have the subscription before the first
			// publish, or NATS core drops the message.
			if err := nc.Flush(); err != nil {
				return res, err
			}
		}
	}
	pubs := make([]*nats.Conn, sc.producers)
	bufs := make([][]byte, sc.producers)
	for i := range pubs {
		if pubs[i], err = env.connect(); err != nil {
			return res, err
		}
		bufs[i] = make([]byte, payloadSize)
	}

	m := startMeter()
	err = runProducers(sc, n, func(p int, seq uint64) error {
		// Publish copies the payload into the connection's buffer, so the
		// producer reuses one.
		fillPayload(bufs[p], seq, stamp)
		return pubs[p].Publish(subject(p%sc.partitions), bufs[p])
	})
	for _, nc := range pubs {
		if err == nil {
			err = nc.Flush() // everything is at the server
		}
	}
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)
	if e := asyncErr.get(); e != nil && err == nil {
		err = fmt.Errorf("async: %w", e)
	} else if e != nil {
		err = fmt.Errorf("%w (async: %v)", err, e)
	}
	tr.finish(&res)
	return res, err
}

// jetstreamPeer runs NATS JetStream: a memory stream, durable pull consumers
// with explicit acks (AckExplicitPolicy, msg.Ack in the callback). Every
// producer and every consumer worker has a connection of its own.
//
// Mapping: one stream "BENCH" on bench.>, a subject per partition.
//   - S1: one durable consumer, one Consume callback.
//   - S2: four durable consumers (one per group), each seeing every message.
//   - S3: producer p publishes to bench.p; the group is one shared durable
//     pull consumer consumed by four workers (four Consume calls), among
//     which the server deals out the messages.
//
// Producers use PublishAsync (at most 4096 unacknowledged publishes in
// flight per producer) and wait for every PubAck before the clock stops
// (through PublishAsyncComplete); a synchronous Publish would measure one
// round trip per message instead of the system's throughput.
//
// msg.Ack does not wait for the server to confirm (AckSync would): the ack
// is sent, and the clock stops when the last handler has run, as for logbus.
type jetstreamPeer struct{ tcp bool }

func (jetstreamPeer) name() string   { return "jetstream" }
func (jetstreamPeer) traits() traits { return traits{slow: true, atLeastOnce: true} }

func (p jetstreamPeer) run(sc scenario, n int) (res result, err error) {
	env, err := startNATS(p.tcp)
	if err != nil {
		return res, err
	}
	defer env.close()
	ctx, cancel := context.WithTimeout(context.Background(), *flagTimeout)
	defer cancel()

	admin, err := env.connect()
	if err != nil {
		return res, err
	}
	js, err := jetstream.New(admin)
	if err != nil {
		return res, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "BENCH",
		Subjects: []string{"bench.>"},
		Storage:  jetstream.MemoryStorage,
	})
	if err != nil {
		return res, err
	}

	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	var (
		ccs      []jetstream.ConsumeContext
		ackErrs  atomic.Int64
		asyncErr firstErr
	)
	// Stop every Consume and wait until its callback has returned, before
	// env.close closes the connections.
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
			<-cc.Closed()
		}
	}()
	for g := range sc.groups {
		// One durable consumer per group; created before publishing and
		// delivering from the start of the stream.
		durable := "g" + strconv.Itoa(g)
		if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       durable,
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		}); err != nil {
			return res, err
		}
		for range sc.consumers {
			nc, err := env.connect()
			if err != nil {
				return res, err
			}
			wjs, err := jetstream.New(nc)
			if err != nil {
				return res, err
			}
			cons, err := wjs.Consumer(ctx, "BENCH", durable)
			if err != nil {
				return res, err
			}
			cc, err := cons.Consume(func(m jetstream.Msg) {
				tr.deliver(g, m.Data())
				if err := m.Ack(); err != nil {
					ackErrs.Add(1)
				}
			}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, e error) {
				asyncErr.set(e)
			}))
			if err != nil {
				return res, err
			}
			ccs = append(ccs, cc)
		}
	}

	pubs := make([]jetstream.JetStream, sc.producers)
	bufs := make([][]byte, sc.producers)
	var pubErrs atomic.Int64
	for i := range pubs {
		nc, err := env.connect()
		if err != nil {
			return res, err
		}
		pubs[i], err = jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(4096),
			jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { pubErrs.Add(1) }))
		if err != nil {
			return res, err
		}
		bufs[i] = make([]byte, payloadSize)
	}

	m := startMeter()
	err = runProducers(sc, n, func(p int, seq uint64) error {
		// PublishAsync copies the payload into the connection's buffer
		// before it returns, so the producer reuses one.
		fillPayload(bufs[p], seq, stamp)
		_, err := pubs[p].PublishAsync(subject(p%sc.partitions), bufs[p])
		return err
	})
	for _, js := range pubs {
		if err != nil {
			break
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			err = fmt.Errorf("waiting for PubAcks: %w", ctx.Err())
		}
	}
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)
	tr.finish(&res)
	if err == nil {
		switch {
		case pubErrs.Load() > 0:
			err = fmt.Errorf("%d async publishes failed", pubErrs.Load())
		case ackErrs.Load() > 0:
			err = fmt.Errorf("%d acks failed", ackErrs.Load())
		}
	}
	if e := asyncErr.get(); e != nil {
		// Consume reports transient conditions here too; note them
		// without failing a run whose deliveries all arrived.
		fmt.Fprintf(os.Stderr, "jetstream %s: consume reported: %v\n", sc.name, e)
	}
	return res, err
}
