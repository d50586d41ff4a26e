package instance

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a certificate authority made for a test
// and of a server certificate it signed, for 127.0.0.1 and localhost.
type TLSFiles struct {
	// CA is the authority's certificate, which clients verify servers
	// with.
	CA string
	// Cert is the server's certificate.
	Cert string
	// Key is the server's private key (EC, unencrypted).
	Key string
}

// NewTLSFiles generates a new certificate authority and a server
// certificate it signs, valid for a day for the IP address 127.0.0.1 and
// the name localhost, into a temporary directory removed when t ends. Two
// calls make two unrelated authorities: a client given the CA of one
// refuses the servers of the other.
func NewTLSFiles(t testing.TB) TLSFiles {
	t.Helper()
	files, err := newTLSFiles(t.TempDir())
	if err != nil {
		t.Fatalf("tls files: %v", err)
	}
	return files
}

func newTLSFiles(dir string) (TLSFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, err
	}
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "outboxmill test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("CA certificate: %w", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return TLSFiles{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, err
	}
	server := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, server, ca, &key.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return TLSFiles{}, err
	}
	files := TLSFiles{
		CA:   filepath.Join(dir, "ca.crt"),
		Cert: filepath.Join(dir, "server.crt"),
		Key:  filepath.Join(dir, "server.key"),
	}
	for path, block := range map[string]*pem.Block{
		files.CA:   {Type: "CERTIFICATE", Bytes: caDER},
		files.Cert: {Type: "CERTIFICATE", Bytes: serverDER},
		files.Key:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return TLSFiles{}, err
		}
	}
	return files, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// copyFile copies src to dst with mode, owned by uid and gid when they are
// not negative.
func copyFile(src, dst string, mode os.FileMode, uid, gid int) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return err
	}
	if uid >= 0 {
		return os.Chown(dst, uid, gid)
	}
	return nil
}
