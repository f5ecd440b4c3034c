-- Argo CD health check for raypipe.dev/ServePipeline (install: deploy/argocd/README.md).
-- Healthy: the newest graph serves. Progressing: not reconciled yet, still deploying, or a
-- canary rollout under way. Degraded: nothing serves, or what serves is not the newest graph
-- (a refused or rolled-back push: Ready stays True because the previous graph keeps serving).
-- Suspended: spec.suspend.
local hs = {}
local function condition(status, kind)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true"
  return hs
end
local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the pipeline to be reconciled"
  return hs
end
if obj.metadata ~= nil and obj.metadata.generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to see the latest spec"
  return hs
end

local ready = condition(status, "Ready")
local current = condition(status, "UpToDate")
local rollout = condition(status, "Progressing")
if ready == nil or ready.status ~= "True" then
  if status.phase == "Failed" or status.phase == "Degraded" then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
  hs.message = (ready ~= nil and ready.message) or "not ready"
  return hs
end
if rollout ~= nil and rollout.status == "True" then
  hs.status = "Progressing"
  hs.message = rollout.message
  return hs
end
if current ~= nil and current.status == "False" then
  if current.reason == "RolloutInProgress" or current.reason == "RayServiceNotReady" then
    hs.status = "Progressing"
  else
    hs.status = "Degraded"
  end
  hs.message = current.message
  return hs
end
hs.status = "Healthy"
hs.message = (current ~= nil and current.message) or ready.message
return hs
