// faultproxy sits between a Kubernetes client under test and the real
// kube-apiserver and injects the faults a production API server shows:
// error answers (429 with Retry-After, 500, 503, 403, ...), added latency,
// and watch streams cut in the middle. Everything else is passed through.
//
//	faultproxy --upstream https://127.0.0.1:6443 --pki DIR/pki \
//	    --listen 127.0.0.1:0 --admin 127.0.0.1:0 --ready-file FILE
//
// Clients talk TLS to it with the control plane's CA (it serves the
// apiserver's own certificate, whose names include 127.0.0.1). A client
// that authenticates with a bearer token has its Authorization header passed
// on unchanged; one that presents a client certificate (checked against the
// CA) is passed on by impersonation (Impersonate-User and Impersonate-Group
// from the certificate's CN and O), the proxy itself authenticating as the
// admin: the apiserver authorizes and audits the client's own identity
// (audit events name it as impersonatedUser).
//
// The admin address (plain HTTP, loopback only) takes:
//
//	POST /inject?prefix=P&status=N&count=C[&retryAfter=S]  the next C requests whose path
//	                                                       starts with P are answered with N
//	POST /clear            drops the injections not yet answered
//	GET  /pending          injections not yet answered (a number)
//	POST /latency?ms=N     delays every request by N ms (0: none)
//	POST /cut-watches      ends every open watch stream (the client sees the stream end)
//	GET  /watches          watch requests begun so far (a number)
//
// When both listeners are up it writes "PROXY_ADDR ADMIN_ADDR" to
// --ready-file.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

type injection struct {
	prefix     string
	status     int
	remaining  int
	retryAfter int
}

type proxy struct {
	mu         sync.Mutex
	injections []*injection
	latency    time.Duration
	watches    int64
	cancels    map[int64]context.CancelFunc
	nextWatch  int64
	upstream   *httputil.ReverseProxy
}

func reasonFor(code int) string {
	switch code {
	case 400:
		return "BadRequest"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "NotFound"
	case 409:
		return "Conflict"
	case 410:
		return "Expired"
	case 429:
		return "TooManyRequests"
	case 503:
		return "ServiceUnavailable"
	case 504:
		return "Timeout"
	default:
		return "InternalError"
	}
}

// takeInjection returns the injection that answers this request, if any.
func (p *proxy) takeInjection(path string) *injection {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, in := range p.injections {
		if strings.HasPrefix(path, in.prefix) {
			in.remaining--
			if in.remaining <= 0 {
				p.injections = append(p.injections[:i], p.injections[i+1:]...)
			}
			c := *in
			return &c
		}
	}
	return nil
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	latency := p.latency
	p.mu.Unlock()
	if latency > 0 {
		time.Sleep(latency)
	}
	if in := p.takeInjection(r.URL.Path); in != nil {
		if in.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(in.retryAfter))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(in.status)
		json.NewEncoder(w).Encode(map[string]any{
			"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
			"message": fmt.Sprintf("injected by faultproxy: %d for %s", in.status, r.URL.Path),
			"reason":  reasonFor(in.status), "code": in.status,
		})
		return
	}
	// Identity: a bearer token goes on as it is; a client certificate by impersonation.
	r.Header.Del("Impersonate-User")
	r.Header.Del("Impersonate-Group")
	if r.Header.Get("Authorization") == "" && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		cert := r.TLS.PeerCertificates[0]
		r.Header.Set("Impersonate-User", cert.Subject.CommonName)
		for _, g := range cert.Subject.Organization {
			r.Header.Add("Impersonate-Group", g)
		}
	}
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		ctx, cancel := context.WithCancel(r.Context())
		p.mu.Lock()
		p.watches++
		id := p.nextWatch
		p.nextWatch++
		p.cancels[id] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.cancels, id)
			p.mu.Unlock()
			cancel()
		}()
		r = r.WithContext(ctx)
	}
	p.upstream.ServeHTTP(w, r)
}

func (p *proxy) admin() http.Handler {
	mux := http.NewServeMux()
	number := func(w http.ResponseWriter, n int64) { fmt.Fprintf(w, "%d\n", n) }
	mux.HandleFunc("POST /inject", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		status, err1 := strconv.Atoi(q.Get("status"))
		count, err2 := strconv.Atoi(q.Get("count"))
		retry := 0
		if s := q.Get("retryAfter"); s != "" {
			retry, _ = strconv.Atoi(s)
		}
		if err1 != nil || err2 != nil || count < 1 || status < 400 || q.Get("prefix") == "" {
			http.Error(w, "inject needs prefix, status >= 400 and count >= 1", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.injections = append(p.injections, &injection{q.Get("prefix"), status, count, retry})
		p.mu.Unlock()
	})
	mux.HandleFunc("POST /clear", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.injections = nil
		p.mu.Unlock()
	})
	mux.HandleFunc("GET /pending", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		n := 0
		for _, in := range p.injections {
			n += in.remaining
		}
		p.mu.Unlock()
		number(w, int64(n))
	})
	mux.HandleFunc("POST /latency", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
		if err != nil || ms < 0 {
			http.Error(w, "latency needs ms >= 0", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.latency = time.Duration(ms) * time.Millisecond
		p.mu.Unlock()
	})
	mux.HandleFunc("POST /cut-watches", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		n := len(p.cancels)
		for _, c := range p.cancels {
			c()
		}
		p.mu.Unlock()
		number(w, int64(n))
	})
	mux.HandleFunc("GET /watches", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		n := p.watches
		p.mu.Unlock()
		number(w, n)
	})
	return mux
}

func main() {
	upstreamURL := flag.String("upstream", "", "kube-apiserver URL (https://127.0.0.1:PORT)")
	pki := flag.String("pki", "", "the control plane's pki directory (ca.crt, apiserver.crt/key, admin.crt/key)")
	listen := flag.String("listen", "127.0.0.1:0", "address for clients (TLS)")
	adminAddr := flag.String("admin", "127.0.0.1:0", "address of the fault-control API (plain HTTP)")
	readyFile := flag.String("ready-file", "", "where to write \"PROXY_ADDR ADMIN_ADDR\" once listening")
	flag.Parse()
	if *upstreamURL == "" || *pki == "" {
		log.Fatal("faultproxy: --upstream and --pki are required")
	}
	target, err := url.Parse(*upstreamURL)
	if err != nil {
		log.Fatalf("faultproxy: --upstream: %v", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(*pki, "ca.crt"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		log.Fatalf("faultproxy: no certificate in %s/ca.crt", *pki)
	}
	serving, err := tls.LoadX509KeyPair(filepath.Join(*pki, "apiserver.crt"), filepath.Join(*pki, "apiserver.key"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	admin, err := tls.LoadX509KeyPair(filepath.Join(*pki, "admin.crt"), filepath.Join(*pki, "admin.key"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // watch events go through as they come
	rp.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{admin}},
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	rp.ErrorLog = log.New(os.Stderr, "faultproxy: ", log.LstdFlags)
	p := &proxy{cancels: map[int64]context.CancelFunc{}, upstream: rp}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("faultproxy: --listen %s: %v", *listen, err)
	}
	aln, err := net.Listen("tcp", *adminAddr)
	if err != nil {
		log.Fatalf("faultproxy: --admin %s: %v", *adminAddr, err)
	}
	srv := &http.Server{
		Handler: p,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{serving},
			ClientCAs:    pool,
			ClientAuth:   tls.VerifyClientCertIfGiven,
			NextProtos:   []string{"http/1.1"},
		},
		ErrorLog: log.New(os.Stderr, "faultproxy: ", log.LstdFlags),
	}
	go func() { log.Fatal(http.Serve(aln, p.admin())) }()
	if *readyFile != "" {
		tmp := *readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+" "+aln.Addr().String()+"\n"), 0o644); err != nil {
			log.Fatalf("faultproxy: %v", err)
		}
		if err := os.Rename(tmp, *readyFile); err != nil {
			log.Fatalf("faultproxy: %v", err)
		}
	}
	log.Fatal(srv.ServeTLS(ln, "", ""))
}
