-- Errors of the SDK and of the gateway, and the "did you mean" of their messages: the same
-- words as Python's (deepx_flow/errors.py) and the Go and JavaScript SDKs', so a mistake
-- reads alike in every language.
--
-- An error is raised as a table (error(e)): e.kind names it as Python does (GraphError,
-- InputError, NotFound, ...), e.message says what, e.status is the gateway's HTTP status
-- where it came from one, e.node the node it is about where it is about one; tostring(e) is
-- "node 'y': message" (or the message alone), as Go's Error() gives it. Catch with pcall:
--
--   local ok, err = pcall(g.sum, g, x, { axis = 1 })
--   if not ok and deepx.is_error(err) then print(err.kind, tostring(err)) end

local M = {}

local Error = { __name = "deepx.Error" }
Error.__index = Error
M.Error = Error

--- A value as Python's repr shows it in messages ('text', 3, None, True, [1, 2]).
local function shown(value)
  local kind = type(value)
  if kind == "string" then return "'" .. value .. "'" end
  if value == nil then return "None" end
  if value == true then return "True" end
  if value == false then return "False" end
  if kind == "number" and math.type(value) == "float" then
    if value ~= value then return "nan" end
    if value == math.huge then return "inf" end
    if value == -math.huge then return "-inf" end
    local text = string.format("%.17g", value)
    for digits = 15, 16 do
      local shorter = string.format("%." .. digits .. "g", value)
      if tonumber(shorter) == value then text = shorter break end
    end
    if not text:find("[%.eEn]") then text = text .. ".0" end
    return text
  end
  if kind == "table" then
    local mt = getmetatable(value)
    if mt and mt.__name == "json.null" then return "None" end
    if mt == nil or mt.__name == "json.array" then
      local parts = {}
      for i = 1, #value do parts[i] = shown(value[i]) end
      return "[" .. table.concat(parts, ", ") .. "]"
    end
  end
  return tostring(value)
end
M.shown = shown

function Error:__tostring()
  if self.node ~= nil and self.node ~= "" then
    return "node " .. shown(self.node) .. ": " .. self.message
  end
  return self.message
end

--- A new error: kind, message, and fields status and node where given.
function M.new(kind, message, fields)
  fields = fields or {}
  return setmetatable({ kind = kind, message = message, status = fields.status, node = fields.node },
    Error)
end

--- Raise a new error.
function M.raise(kind, message, fields)
  error(M.new(kind, message, fields), 0)
end

--- Raise a GraphError about node (a format string and its values, as string.format).
function M.graph_error(node, format, ...)
  error(M.new("GraphError", string.format(format, ...), { node = node }), 0)
end

--- Whether value is an error of this SDK.
function M.is_error(value)
  return getmetatable(value) == Error
end

-- Ratcliff/Obershelp similarity, as Python's difflib.SequenceMatcher.ratio() computes it
-- (no junk: the words compared are short). Words are compared by code point.
local function code_points(s)
  local out = {}
  if utf8.len(s) then
    for _, c in utf8.codes(s) do out[#out + 1] = c end
  else
    for i = 1, #s do out[i] = s:byte(i) end
  end
  return out
end

local function longest_match(a, b, alo, ahi, blo, bhi)
  local bi, bj, bk = alo, blo, 0
  local lengths = {}
  for i = alo, ahi - 1 do
    local next_lengths = {}
    for j = blo, bhi - 1 do
      if a[i + 1] == b[j + 1] then
        local k = (lengths[j - 1] or 0) + 1
        next_lengths[j] = k
        if k > bk then bi, bj, bk = i - k + 1, j - k + 1, k end
      end
    end
    lengths = next_lengths
  end
  return bi, bj, bk
end

local function matched(a, b, alo, ahi, blo, bhi)
  local i, j, k = longest_match(a, b, alo, ahi, blo, bhi)
  if k == 0 then return 0 end
  local total = k
  if alo < i and blo < j then total = total + matched(a, b, alo, i, blo, j) end
  if i + k < ahi and j + k < bhi then total = total + matched(a, b, i + k, ahi, j + k, bhi) end
  return total
end

local function ratio(a, b)
  local ra, rb = code_points(a), code_points(b)
  if #ra + #rb == 0 then return 1 end
  return 2 * matched(ra, rb, 0, #ra, 0, #rb) / (#ra + #rb)
end

--- The choice spelled most like word (case ignored; a ratio of at least 0.6), or nil:
-- Python's errors.closest.
function M.closest(word, choices)
  local lowered, order = {}, {}
  for _, c in ipairs(choices) do
    local l = c:lower()
    if lowered[l] == nil then
      lowered[l] = c
      order[#order + 1] = l
    end
  end
  local best_score, best = -1, nil
  local target = tostring(word):lower()
  for _, candidate in ipairs(order) do
    local score = ratio(candidate, target)
    -- (ties: difflib keeps the largest (score, word) pair)
    if score >= 0.6 and (score > best_score or (score == best_score and candidate > best)) then
      best_score, best = score, candidate
    end
  end
  return best and lowered[best]
end

--- " (did you mean 'relu'?)", or "" where no choice is close.
function M.did_you_mean(word, choices)
  local c = M.closest(word, choices)
  return c and (" (did you mean " .. shown(c) .. "?)") or ""
end

return M
