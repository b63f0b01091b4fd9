// tests/models/make_backbone_fixtures.cpp — writes the backbone fixtures (backbone_cases.hpp) into a folder.
//
//   build/bin/make_backbone_fixtures tests/models/fixtures
//
// Run once, on the code before the backbones were rebuilt on the SDK blocks (commit "tests/models:
// backbone fixtures"); the fixtures are the record of that behaviour and are never regenerated to make
// test_backbone_fixtures pass.
#include <iostream>
#include <string>

#include "backbone_cases.hpp"

int main(int argc, char** argv) {
  namespace bf = backbone_fixtures;
  if (argc != 2) {
    std::cerr << "usage: make_backbone_fixtures OUTPUT_DIR\n";
    return 2;
  }
  try {
    for (const bf::Case& c : bf::cases()) {
      auto m = bf::make_model(c);
      dew::CheckpointData d;
      for (auto& [name, p] : m->named_parameters()) d.state_text["init." + name] = bf::fnv1a_hex(p);
      bf::randomize(*m);
      for (auto& [name, p] : m->named_parameters()) d.params.push_back({name, p.clone()});
      const dew::NamedTensors inputs = bf::make_inputs(c);
      const bf::Results r = bf::run_model(c, *m, inputs);
      std::string config;
      for (auto& [k, v] : c.options) config += k + " = " + v + "\n";
      d.attributes["fixture.plugin"] = c.plugin;
      d.attributes["fixture.options"] = config;
      for (auto& [k, v] : inputs) d.state_tensors.push_back({"input." + k, v});
      for (auto& [k, v] : r.outputs) d.state_tensors.push_back({k, v.detach()});
      for (auto& [k, v] : r.grads) d.state_text[k] = bf::fnv1a_hex(v);
      d.state_values["num_parameters"] = r.num_parameters;
      d.state_values["flops_per_sample"] = r.flops;
      const std::string path = std::string(argv[1]) + "/" + c.name + ".h5";
      dew::write_checkpoint(path, d);
      std::cout << path << ": " << m->named_parameters().size() << " parameters, " << r.outputs.size() << " outputs\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "make_backbone_fixtures: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
