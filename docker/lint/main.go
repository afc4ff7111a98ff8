// deploylint checks the deployment files that cannot run on the project's machines, against the
// real Go types of the software that reads them:
//
//	deploylint envoy docker/envoy.yaml          // Envoy bootstrap: strict protojson + the protoc-gen-validate rules
//	deploylint gateway docker/k8s/gateway/*.yaml // Gateway API and Envoy Gateway objects: strict decoding
//
// Unknown fields, wrong types, unknown typed_config types and violated constraints fail.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"google.golang.org/protobuf/encoding/protojson"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	// typed_config types docker/envoy.yaml uses: registered so that protojson can resolve them
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

func checkEnvoy(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return err
	}
	var bootstrap bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &bootstrap); err != nil {
		return err
	}
	return bootstrap.ValidateAll()
}

// gatewayKinds maps apiVersion/kind to a new, empty object of the Go type that controllers decode.
var gatewayKinds = map[string]func() any{
	"gateway.networking.k8s.io/v1/Gateway":                func() any { return &gwv1.Gateway{} },
	"gateway.networking.k8s.io/v1/GRPCRoute":              func() any { return &gwv1.GRPCRoute{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":              func() any { return &gwv1.HTTPRoute{} },
	"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": func() any { return &egv1a1.BackendTrafficPolicy{} },
}

func checkGateway(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	n := 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return err
		}
		newObj, ok := gatewayKinds[head.APIVersion+"/"+head.Kind]
		if !ok {
			return fmt.Errorf("document %d: no Go type known for %s %s", n, head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, newObj()); err != nil {
			return fmt.Errorf("document %d (%s): %w", n, head.Kind, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no objects")
	}
	return nil
}

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "envoy" && os.Args[1] != "gateway") {
		fmt.Fprintln(os.Stderr, "usage: deploylint envoy|gateway FILE...")
		os.Exit(2)
	}
	check := checkEnvoy
	if os.Args[1] == "gateway" {
		check = checkGateway
	}
	failed := false
	for _, path := range os.Args[2:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
		} else {
			fmt.Printf("%s: ok (%s)\n", path, os.Args[1])
		}
	}
	if failed {
		os.Exit(1)
	}
}
