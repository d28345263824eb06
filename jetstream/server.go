package jetstream

import (
	"errors"
	"fmt"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server is an embedded NATS server with JetStream, for a process that
// wants durable topics without running a server: it listens on a random
// port of 127.0.0.1 only, and keeps its data in the directory it was
// started with. Its methods are safe for concurrent use.
type Server struct {
	srv *server.Server
}

// ServerOption configures the server [StartServer] starts.
type ServerOption interface{ applyServer(*server.Options) }

type serverOptionFunc func(*server.Options)

func (f serverOptionFunc) applyServer(o *server.Options) { f(o) }

// WithSyncAlways makes the server write every record to disk (fsync)
// before it acknowledges it, so that an acknowledged publish, and a
// commit, survive the machine losing power. Without it the server
// flushes each write to the operating system, which keeps it through a
// crash of the process, but syncs the disk only every two minutes: a power
// loss may take up to that much acknowledged data. It costs throughput:
// each Publish waits for a disk sync, about ten times slower on the
// machine measured, and a PublishBatch about twenty times, since the
// server syncs a batch's records one by one (bench/README.md).
func WithSyncAlways() ServerOption {
	return serverOptionFunc(func(o *server.Options) { o.SyncAlways = true })
}

// StartServer starts an embedded server that stores its data in dir
// (created if needed), and returns once it accepts connections, at most
// 10s later. Starting it again on the same dir finds every topic, offset
// and dead letter that was there. The caller must call Shutdown.
func StartServer(dir string, opts ...ServerOption) (*Server, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: jetstream: StartServer needs a directory", engine.ErrInvalid)
	}
	sopts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  dir,
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: jetstream: StartServer: a nil option", engine.ErrInvalid)
		}
		o.applyServer(sopts)
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("jetstream: start server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("jetstream: start server: not ready after 10s")
	}
	return &Server{srv: srv}, nil
}

// URL is the server's client URL (nats://127.0.0.1:port), for processes
// that connect over the loopback interface.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Connect opens a new connection to the server, in process (no socket).
// The caller closes it.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(s.srv)}, opts...)
	return nats.Connect(s.srv.ClientURL(), opts...)
}

// Engine returns an engine on this server for pubsub.WithEngine. Every
// broker opened with it gets a connection of its own, which the broker's
// Close closes: two brokers on one Server behave as two processes would.
func (s *Server) Engine(opts ...Option) engine.Driver {
	return &opener{cfg: opts, dial: func() (*nats.Conn, error) { return s.Connect(nats.Name("logbus")) }}
}

// Shutdown stops the server and waits for it. Brokers still using it see
// their connections closed.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
