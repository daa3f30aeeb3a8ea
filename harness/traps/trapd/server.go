// The stack's Toxiproxy, with traps: `trapd -host H -port P` serves Toxiproxy's HTTP API, plus
//
//   - `GET /trapd`, upgraded to the control channel of one harness (control.go);
//   - the mirror: a toxic added to, changed on or removed from a stack proxy, and the proxy
//     disabled or enabled, is done to its trap proxies (twins) too, so a network fault reaches the
//     service's connections as it would without traps;
//   - `POST /reset` that keeps the trap toxics (Toxiproxy's own would remove them from the twins).
package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// serveToxiproxy runs the API server until SIGINT or SIGTERM.
func serveToxiproxy(args []string) error {
	flags := flag.NewFlagSet("trapd", flag.ContinueOnError)
	host := flags.String("host", "localhost", "the host the API listens on")
	port := flags.String("port", "8474", "the port the API listens on")
	config := flags.String("config", "", "a JSON file of proxies to create at start")
	if err := flags.Parse(args); err != nil {
		return err
	}
	toxiproxy.Version = "2.12.0+txchaos-trapd" // what GET /version answers: Toxiproxy's release, with the traps
	logger := zerolog.New(os.Stdout).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	if *config != "" {
		server.PopulateConfig(*config)
	}
	engine = newEngine(server, true)
	httpServer := &http.Server{
		Addr:              net.JoinHostPort(*host, *port),
		Handler:           engine.handler(server.Routes()),
		ReadHeaderTimeout: 15 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	failed := make(chan error, 1)
	go func() { failed <- httpServer.ListenAndServe() }()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-failed:
		return err
	case <-signals:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return httpServer.Shutdown(ctx)
}

// handler serves /trapd and the reset itself, mirrors what changes a stack proxy, and leaves
// the rest to Toxiproxy's routes.
func (e *Engine) handler(routes http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch {
		case r.URL.Path == "/trapd" && r.Method == http.MethodGet:
			e.upgrade(w)
		case r.URL.Path == "/reset" && r.Method == http.MethodPost:
			e.reset(r.Context())
			w.WriteHeader(http.StatusNoContent)
		case parts[0] == "proxies" && len(parts) > 1 && r.Method != http.MethodGet:
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			status := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			routes.ServeHTTP(status, r)
			if status.status < 300 {
				e.mirror(r.Context(), r.Method, parts[1:], body)
			}
		default:
			routes.ServeHTTP(w, r)
		}
	})
}

// mirror does to the twins of a stack proxy what was just done to it; path is what follows
// /proxies/: NAME, NAME/toxics or NAME/toxics/TOXIC.
func (e *Engine) mirror(ctx context.Context, method string, path []string, body []byte) {
	route, err := e.collection.Get(path[0])
	if err != nil {
		return
	}
	for _, twin := range e.twins(route.Name) {
		chain := twin.tp.Toxics
		switch {
		case len(path) == 1 && method != http.MethodDelete:
			if route.Enabled {
				twin.tp.Start() // already started is fine
			} else {
				twin.tp.Stop()
			}
		case len(path) == 2 && method == http.MethodPost:
			chain.AddToxicJson(bytes.NewReader(body))
		case len(path) == 3 && method == http.MethodDelete:
			chain.RemoveToxic(ctx, path[2])
		case len(path) == 3:
			chain.UpdateToxicJson(path[2], bytes.NewReader(body))
		}
	}
}

// reset enables every proxy and removes every toxic but the traps.
func (e *Engine) reset(ctx context.Context) {
	for _, p := range e.collection.Proxies() {
		p.Start() // already started is fine
		if e.twinOf(p.Name) == nil {
			p.Toxics.ResetToxics(ctx)
			continue
		}
		for _, t := range p.Toxics.GetToxicArray() {
			if w, ok := t.(*toxics.ToxicWrapper); ok && w.Type != TrapToxic {
				p.Toxics.RemoveToxic(ctx, w.Name)
			}
		}
	}
}

// upgrade turns the request's connection into a control channel and serves it until it closes.
func (e *Engine) upgrade(w http.ResponseWriter) {
	hijacker, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no upgrade on this connection", http.StatusInternalServerError)
		return
	}
	conn, rw, err := hijacker.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Time{}) // the channel lives as long as the run
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: trapd\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	e.serve(rw.Reader, conn)
}

// statusWriter remembers the status Toxiproxy answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}
